"""The data wing: what goes in and how replies are read, with no model and no torch.

The datasets `--dataset` names (datasets) and one reader each (averitec, checkcovid, healthver, politihop,
proclaim, userdata), the claim record and its evidence conditions (claims), what every reader of a user's file
shares (inputs: the error, text without a byte-order mark, unique claim ids), the verdict labels of each
dataset (labels), JSON Lines (jsonl), the prompt
files and their placeholders (prompts), the JSON object each prompt asks for (answer_schemas) and the tolerant
reader of replies (parsing). The invented demo claims ship in demo/.

May import: nothing of debate's; every other wing may import it.
"""
