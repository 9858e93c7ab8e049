"""debatecv: debate-driven claim verification on local models. From Python: `build`, `run`, `Verifier`, `view`, `geval`
(debate.api).

Four wings, each a package whose docstring says what it owns: pipeline (config, CLI, runner, records) ->
methods (DebateCV, baselines, MADR, the courtroom) -> engine (models, KV cache, generation); data (claims,
labels, prompts, answer_schemas, parsing) sits below all three. Imports only go that way.

The names are looked up on first use, so `import debate.data.claims` (or the CLIs' --help) never imports torch.
"""
API = ("RunConfig", "Verifier", "build", "load", "save", "run", "verify", "view", "geval")


def __getattr__(name):
    if name in API:
        from debate import api

        return getattr(api, name)
    raise AttributeError(f"module 'debate' has no attribute {name!r}")
