"""debatecv: debate-driven claim verification on local models. From Python: `build`, `run`, `verify` (debate.api).

The names are looked up on first use, so `import debate.data` (or the CLIs' --help) never imports torch.
"""
API = ("RunConfig", "build", "load", "save", "run", "verify")


def __getattr__(name):
    if name in API:
        from debate import api

        return getattr(api, name)
    raise AttributeError(f"module 'debate' has no attribute {name!r}")
