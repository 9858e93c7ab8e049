"""The methods wing: who speaks, with which prompt, and when a claim is decided.

The turn API every method shares (turns), DebateCV (debatecv), the DebateCV paper's baselines (baselines),
MADR's refinement of justifications (madr) and PROClaim's courtroom (the courtroom package, one module a
stage). A method is a plain function over a batch of claims that returns (and hands over) their records.

May import: debate.engine and debate.data. Never debate.pipeline.
"""
