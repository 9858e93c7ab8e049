"""Each method's row: the function that verifies a batch of claims, its roles and the model flag of each, its
keyword options from the config, the JSON answers it asks for and the most turns a claim can take; and the
agents a run loads for those roles."""
import os
from types import SimpleNamespace

from debate.engine import engine, gguf, models
from debate.methods import baselines, debatecv, explain, madr, proclaim_baselines, turns
from debate.methods.courtroom import case as courtroom_case, trial as courtroom
from debate.pipeline import grown_evidence
from debate.pipeline.config import COURTROOM_METHODS


def _fixed(table):
    return lambda config: dict(table)


# The JSON answers each method asks for, checked against --max-new-tokens before any claim runs.
SCHEMAS = {"debatecv": debatecv.SCHEMAS, **baselines.SCHEMAS, "courtroom": courtroom.SCHEMAS,
           **proclaim_baselines.SCHEMAS}

# name -> (function over a batch of claims, its roles -> model flag, its keyword options from the config)
METHODS = {
    "debatecv": (debatecv.run_batch, _fixed(debatecv.MODEL_OF), lambda c: {"max_rounds": c.generation.max_rounds}),
    "rag-cot": (baselines.rag_cot, _fixed(baselines.RAG_COT_MODELS), lambda c: {}),
    "majority": (baselines.majority, _fixed(baselines.RAG_COT_MODELS), lambda c: {"voters": c.method.voters}),
    "cooperation": (baselines.cooperation, _fixed(baselines.COOPERATION_MODELS),
                    lambda c: {"max_rounds": c.generation.max_rounds}),
    # The courtroom and PROClaim's Table 4 baselines also get their retrieval library (method_options).
    "courtroom": (courtroom.run_batch, lambda c: courtroom.model_of(len(c.models.judge_models)),
                  lambda c: {"max_rounds": c.generation.max_rounds, "options": c.courtroom}),
    "standard-mad": (proclaim_baselines.standard_mad, _fixed(proclaim_baselines.STANDARD_MAD_MODELS),
                     lambda c: {"max_rounds": c.generation.max_rounds, "options": c.courtroom}),
    "single-call": (proclaim_baselines.single_call, _fixed(proclaim_baselines.SINGLE_CALL_MODELS),
                    lambda c: {"options": c.courtroom}),
}


# --task explain: name -> (function over a batch of claims, its roles -> model flag, its keyword options)
EXPLAIN_METHODS = {
    "zero-shot": (explain.zero_shot, _fixed(explain.EXPLAINER), lambda c: {}),
    "cot": (explain.cot, _fixed(explain.EXPLAINER), lambda c: {}),
    "self-refine": (explain.self_refine, _fixed(explain.SELF_REFINE_MODELS),
                    lambda c: {"max_iterations": c.madr.self_refine_iterations}),
    "madr": (madr.explain, _fixed(madr.EXPLAIN_MODELS),
             lambda c: {"max_iterations": c.madr.madr_iterations, "temperature": c.madr.madr_temperature}),
}
EXPLAIN_SCHEMAS = {**explain.SCHEMAS, "madr": explain.SCHEMAS["zero-shot"] + madr.SCHEMAS}


def method_entry(config):
    """(function, roles, options) of the config's method, from its task's table."""
    return (EXPLAIN_METHODS if config.method.task == "explain" else METHODS)[config.method.method]


# The most turns one claim can take, per method, for the time left before a batch has finished (an
# upper bound: a debate may stop early). The courtroom's depends on its discovery; there is none.
TURNS_AT_MOST = {"debatecv": lambda c: (5 if c.debate.debate_retrieval else 3) * c.generation.max_rounds + 1,
                 "rag-cot": lambda c: 1,
                 "majority": lambda c: c.method.voters, "cooperation": lambda c: 2 * c.generation.max_rounds + 1}
EXPLAIN_TURNS_AT_MOST = {"zero-shot": lambda c: 1, "cot": lambda c: 1,
                         "self-refine": lambda c: 1 + 2 * c.madr.self_refine_iterations,
                         "madr": lambda c: 1 + 2 + 3 * c.madr.madr_iterations + 1}


# Model flag of a role (as model_roles names it) -> the setting holding its path.


FLAG_ARGS = {"debater": "debater_model", "moderator": "moderator_model", "defense": "defense_model",
             "refine": "refine_model", "court": "court_model", "critic": "critic_model", "witness": "witness_model"}


def method_options(config, labels, passages=None):
    """The keyword options of the config's method: its table's (method_entry), the dataset's labels (every
    method's verdicts, or the label an explanation explains, are among them), and for the courtroom's methods
    their retrieval library over --corpus or `passages` (evidence.Inputs.passages); building it loads the encoder."""
    kwargs = dict(method_entry(config)[2](config), labels=labels)
    if config.method.task == "verify" and config.method.method in COURTROOM_METHODS:
        store = config.retrieval.knowledge_store if config.data.evidence == "retrieved" else None
        kwargs["library"] = courtroom_case.library_from(config.courtroom, passages, store=store,
                                                        bm25_k=config.retrieval.bm25_k)
    if config.method.task == "verify" and config.debate.debate_retrieval:  # DebateCV's search during the debate
        kwargs.update(grown_evidence.method_options(config))
    return kwargs


def model_roles(config):
    """{role: model flag} of the chosen method, plus MADR's roles when refining."""
    roles = method_entry(config)[1](config)
    if config.method.refine == "madr":
        roles.update(madr.MODEL_OF)
    return roles


def role_models(config, roles):
    """({role: model path}, {role: adapter}) of `roles` ({role: model flag}) under the config's models."""
    m = config.models
    paths = {"debater": m.debater_model, "moderator": m.moderator_model, "defense": m.defense_model,
             "refine": m.refine_model, "court": m.court_model, "critic": m.critic_model, "witness": m.witness_model,
             **{f"judge_{i + 1}": p for i, p in enumerate(m.judge_models)}}
    role_paths = {role: paths[flag] for role, flag in roles.items()}
    # The adapter goes on the Moderator's roles, and on the courtroom's court and critic while they run on
    # the Moderator's model (their default).
    adapters = {role: m.moderator_adapter for role, flag in roles.items()
                if flag == "moderator" or (flag in ("court", "critic") and paths[flag] == m.moderator_model)}
    return role_paths, adapters


def load_agents(config, roles):
    role_paths, adapters = role_models(config, roles)
    return models.load_roles(role_paths, adapters, use_4bit=config.models.use_4bit,
                             device_map=config.models.device_map,
                             dtype=models.run_dtype(config.models.dtype))


def settings_of(config, agents=None):
    """The engine's generation settings of a run; `agents` (role -> RoleModel) decide --compile's default: on where
    the models run on CUDA."""
    g = config.generation
    compile_steps = g.compile
    if compile_steps is None:
        compile_steps = bool(agents) and all(next(a.model.parameters()).device.type == "cuda" for a in agents.values())
    return engine.Settings(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p, seed=g.seed,
                           reuse_cache=g.reuse_cache, structured=g.structured, max_context=g.max_context,
                           compile=compile_steps, prefill_tokens=g.prefill_tokens)


def check_schemas(config, agents, settings, labels):
    """Refuse a --max-new-tokens too short for the JSON answers the method (and MADR) ask for."""
    table = EXPLAIN_SCHEMAS if config.method.task == "explain" else SCHEMAS
    names = table[config.method.method] + (madr.SCHEMAS if config.method.refine == "madr" else ())
    turns.check_schemas(agents, names, settings, labels)


def tokenizers_of(config):
    """{role: an object with only `tokenizer`} for the roles whose model's tokenizer can be read without its weights
    (a model directory, or a GGUF already converted in the cache); the others are left out, for the check after the
    weights load to cover."""
    from transformers import AutoTokenizer

    role_paths, _ = role_models(config, model_roles(config))
    read, out = {}, {}
    for role, path in role_paths.items():
        folder = path if os.path.isdir(path) else gguf.converted_dir(path)
        if folder not in read:
            try:
                read[folder] = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(folder, local_files_only=True))
            except Exception:  # no tokenizer there yet (a GGUF not converted): the later check covers it
                read[folder] = None
        if read[folder] is not None:
            out[role] = read[folder]
    return out


def check_schemas_early(config, labels):
    """`check_schemas` from the tokenizers alone, before any weight loads (docs/averitec.md: such checks run before),
    so a --max-new-tokens too short for a JSON answer costs a second, not the loading of every model."""
    tokenizers = tokenizers_of(config)
    if tokenizers:
        check_schemas(config, tokenizers, settings_of(config), labels)
