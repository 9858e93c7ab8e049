"""debatecv: debate-driven claim verification on local models. From Python: `build`, `run`, `Verifier`, `view`, `geval`
(debate.api).

Four wings, each a package whose docstring says what it owns: pipeline (config, CLI, runner, records) ->
methods (DebateCV, baselines, MADR, the courtroom) -> engine (models, KV cache, generation); data (claims,
labels, prompts, answer_schemas, parsing) sits below all three. Imports only go that way.

The names are looked up on first use, so `import debate.data.claims` (or the CLIs' --help) never imports torch.

Any import of the package first runs this file, so the Hugging Face offline switches and the block on the `kernels`
package (debate/engine/offline.py) are set here, before any module of ours can import transformers, whatever the
caller imports first (debate.engine.engine reaches transformers through the decode modules, long before models).
"""
from debate.engine import offline as _offline

_offline.set_offline()

API = ("RunConfig", "Verifier", "build", "load", "save", "run", "verify", "view", "geval")


def __getattr__(name):
    if name in API:
        from debate import api

        return getattr(api, name)
    raise AttributeError(f"module 'debate' has no attribute {name!r}")
