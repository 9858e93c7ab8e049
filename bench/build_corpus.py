"""A real retrieval corpus for the courtroom: the evidence of every AVeriTeC dev claim pooled together.

    python bench/build_corpus.py [--data-dir ../shared/data/averitec] [--split dev]
                                 [--out bench/out/averitec-dev-corpus.jsonl]

Every golden QA item (the annotators' evidence, as averitec.load_split builds it) and every retrieved QA
item (HerO's, <split>.retrieved.hero.jsonl) of all claims goes into one JSONL corpus, so a claim's own
golden evidence is hidden among everyone else's. The file is in the format retrieval.load_corpus reads:

    {"id", "text", "url", "question", "answer", "claim_id", "source": "gold" | "retrieved", "also": [ids]}

- One passage per QA item; text = "question answer", exactly as retrieval.evidence_passages writes it.
- Ids: gold-{claim_id}-{j} and hero-{claim_id}-{j}, j the item's position in the claim's golden
  evidence (averitec.load_split order, left-out items included) or in its retrieved list, so an id always
  names the same item of the data whatever is left out.
- Golden items whose answer is averitec.NO_ANSWER ("No answer could be found.") are left out: they say that
  nothing was found, they are not evidence anyone could retrieve.
- Items with an empty text are left out (load_corpus refuses them).
- Exact duplicate texts are kept once: all golden items come first (claim order), then all retrieved
  items, and the first copy is kept, so a text found both ways is kept as gold. The ids of the copies
  left out are listed in the kept passage's `also`, so a recall benchmark can count the kept passage as
  each of them (the same gold text of two claims is gold evidence for both).
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from debate.data import averitec, claims as data, jsonl  # noqa: E402

DEFAULT_DATA_DIR = ROOT.parent / "shared" / "data" / "averitec"
DEFAULT_OUT = ROOT / "bench" / "out" / "averitec-dev-corpus.jsonl"


def _passage(pid, item, claim_id, source):
    return {"id": pid, "text": f"{item['question']} {item['answer']}".strip(), "url": item.get("url") or "",
            "question": item["question"], "answer": item["answer"], "claim_id": claim_id, "source": source,
            "also": []}


def build_corpus(data_dir, split="dev"):
    """The pooled corpus of `split` in `data_dir`: (passages, counts of what was kept and left out)."""
    claims = averitec.load_split(split, data_dir)
    retrieved = data.load_retrieved(averitec.retrieved_path(split, data_dir))
    counts = {"claims": len(claims), "gold_items": 0, "gold_no_answer": 0, "retrieved_items": 0,
              "empty_text": 0, "duplicates": 0}
    candidates = []  # golden items first, so a text found both ways is kept as gold
    for claim in claims:
        for j, item in enumerate(claim["gold_evidence"]):
            counts["gold_items"] += 1
            if item["answer"] == averitec.NO_ANSWER:
                counts["gold_no_answer"] += 1
                continue
            candidates.append(_passage(f"gold-{claim['claim_id']}-{j}", item, claim["claim_id"], "gold"))
    for claim in claims:
        # A claim with no retrieved row simply adds nothing; the golden part stands on its own.
        for j, item in enumerate(retrieved.get(str(claim["claim_id"]), [])):
            counts["retrieved_items"] += 1
            candidates.append(_passage(f"hero-{claim['claim_id']}-{j}", item, claim["claim_id"], "retrieved"))

    passages, kept = [], {}  # text -> the passage that holds it
    for p in candidates:
        if not p["text"]:
            counts["empty_text"] += 1
        elif p["text"] in kept:
            kept[p["text"]]["also"].append(p["id"])
            counts["duplicates"] += 1
        else:
            kept[p["text"]] = p
            passages.append(p)
    counts["passages"] = len(passages)
    counts["gold_passages"] = sum(p["source"] == "gold" for p in passages)
    counts["retrieved_passages"] = len(passages) - counts["gold_passages"]
    return passages, counts


def write_corpus(passages, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonl.write(path, passages)  # atomic: a crash never leaves half a corpus under the final name


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--split", default="dev")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    passages, counts = build_corpus(args.data_dir, args.split)
    write_corpus(passages, args.out)
    print(f"{args.out}: {counts['passages']} passages ({counts['gold_passages']} gold, "
          f"{counts['retrieved_passages']} retrieved) from {counts['claims']} claims")
    print(f"  gold items {counts['gold_items']}, of which '{averitec.NO_ANSWER}' left out: {counts['gold_no_answer']}")
    print(f"  retrieved items {counts['retrieved_items']}; exact duplicate texts kept once: {counts['duplicates']} "
          f"copies folded into 'also'; empty texts left out: {counts['empty_text']}")


if __name__ == "__main__":
    main()
