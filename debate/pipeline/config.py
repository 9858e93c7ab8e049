"""One run's settings: frozen dataclasses, the single source of every default and of the resume identity.

    config = build(split="demo", method="rag-cot", limit=2)    # checked, every derived default filled in
    save(config, "config.json"); load("config.json") == config

The groups follow `run_debate.py --help`: data, method, models, generation, courtroom, MADR, output. A
field's name is its flag's (`top_k` is `--top-k`), and config.json holds the fields flat under those
names, as it always has, so a run directory written before these classes existed still resumes. The
flags take their defaults from the fields (cli.run_parser), so a default is written once, here.

A field marked `identity` changes what a run predicts: resuming a directory whose config.json differs in
one would mix two experiments (records.check refuses it). The others (how many claims, batch size,
where to write) may change between a run and its resumption.

`build` is the only place a config is made from settings: it refuses values that make no run, with the
flag named as the CLI prints it, and fills in the defaults that depend on other settings (tokens per turn
on the demo split, rounds and temperature per method, the models of roles not named). A config is
never changed afterwards; a trial is a new config made with dataclasses.replace.
"""
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

FULL_TURN, DEMO_TURN = 512, 96  # default tokens per turn; the demo's shorter turns keep the CPU demo to minutes
DEMO_SPLIT = "demo"
# A model path's stand-in for the embedded Gemma 3 270M: a base model that shows the pipeline on the demo split. On
# any other split it debates only when named (`--model demo`); by default it would write verdicts that mean little.
DEMO_MODEL = "demo"
METHOD_NAMES = ("debatecv", "rag-cot", "majority", "cooperation", "courtroom", "standard-mad", "single-call")
# PROClaim's system and its Table 4 baselines: they retrieve with the Courtroom group's corpus and encoder.
COURTROOM_METHODS = ("courtroom", "standard-mad", "single-call")
ROUNDS = {"courtroom": 10}  # default max_rounds per method; 3 for the others (Standard MAD's fixed 3 included)
NO_PRAG_ROUNDS = 3  # PROClaim's ablation A3 (no P-RAG) runs 3 rounds (Table 6), its rerun too (Table 5's 6.00)
# --task explain: write the explanation of each claim's gold label (the MADR paper's task and its baselines).
TASKS = ("verify", "explain")
EXPLAIN_METHODS = ("zero-shot", "cot", "self-refine", "madr")
EXPLAIN_TEMPERATURE = 0.0  # ours: greedy, so Self-Refine and MADR start from the Zero-shot explanation itself
# Default temperature: the DebateCV paper's 0.7 for every LLM of its methods (Appendix C). PROClaim's
# methods sample each role at its own temperature (COURTROOM_TEMPERATURES); their run-wide value is unused.
PAPER_TEMPERATURE = 0.7
TEMPERATURE = {m: 0.0 for m in COURTROOM_METHODS}
MAX_JUDGES = 3
# The courtroom roles' sampling temperatures in PROClaim (Appendix B.3): counsels and the expert witness
# 0.5, the presiding court 0.2, the judges 0.3, the critic 0.3 (its model also mines the premises and
# scores the role-switch consistency).
COURTROOM_TEMPERATURES = {"counsel": 0.5, "court": 0.2, "judge": 0.3, "witness": 0.5, "critic": 0.3}
# Recorded in config.json at run time, not set: the hash of the --prompts files a run read,
RECORDED_IDENTITY = ("prompts_hash", "labels")  # and the labels of its dataset (a jsonl card may change)


class ConfigError(ValueError):
    """Settings that make no run; the message names the flag."""


class NoModel(ConfigError):
    """No model named for a split that is not the demo's: the CLI says it together with what else is missing."""


def identity(default: Any = None) -> Any:
    """A field that is part of the run's identity (see the module doc)."""
    return field(default=default, metadata={"identity": True})


@dataclass(frozen=True)
class Data:
    dataset: str = identity("averitec")  # one of debate.data.datasets.NAMES
    split: str = identity("dev")  # a split of the dataset (AVeriTeC: DATA_DIR/<split>.json, or "demo", embedded)
    # None: the dataset's default folder ($DEBATECV_DATA, else data/averitec, for AVeriTeC)
    data_dir: Optional[str] = identity()
    evidence: Optional[str] = identity()  # golden | retrieved | none | ruling (PolitiHop); None: the dataset's default
    # None: the dataset's own (AVeriTeC: DATA_DIR/<split>.retrieved.hero.jsonl)
    retrieved_file: Optional[str] = identity()
    evidence_k: int = identity(5)  # retrieved from a corpus: passages per claim (ours)
    limit: Optional[int] = None  # only the first N claims; None: all
    sample_seed: Optional[int] = None  # with limit: N claims drawn at random with this seed instead of the first N


@dataclass(frozen=True)
class Method:
    method: str = identity("debatecv")  # one of METHOD_NAMES (EXPLAIN_METHODS under --task explain)
    refine: str = identity("none")  # none | madr
    voters: int = identity(3)  # majority: independent RAG-CoT agents (the DebateCV paper's three)
    # a directory of prompt files replacing the shipped ones; its files' hash is the identity
    prompts: Optional[str] = None
    task: str = identity("verify")  # verify: a verdict per claim; explain: the explanation of its gold label


@dataclass(frozen=True)
class Courtroom:
    """PROClaim's numbers, the paper's by default (see debate/methods/courtroom/rules.py and docs/FIDELITY.md);
    the courtroom and its baselines (standard-mad, single-call) run with this group."""
    corpus: Optional[str] = identity()  # JSONL passages; None: the dataset's corpus, else each claim's own evidence
    claim_evidence_only: bool = identity(False)  # ours: search each claim's own evidence, never a corpus
    embedder: Optional[str] = identity()  # sentence encoder directory; None: the shipped all-MiniLM-L6-v2
    top_k: int = identity(3)
    novelty_threshold: float = identity(0.20)
    novelty_stop: float = identity(0.10)
    plateau_delta: float = identity(0.05)
    admit_threshold: float = identity(0.5)
    dispute_threshold: float = identity(0.1)
    reflection_weights: Tuple[float, ...] = identity((0.4, 0.3, 0.3))
    vote_weight: float = identity(0.8)
    quality_weight: float = identity(0.3)
    role_switch: bool = identity(True)  # False: ablation A1 (Table 6)
    single_judge: bool = identity(False)  # True: ablation A2, the first --judge-models path alone
    prag: bool = identity(True)  # False: ablation A3, no P-RAG, no adaptive stopping, 3 rounds
    reflection: bool = identity(True)  # False: ablation A4, no self-reflection (nor its uses)
    witness: bool = identity(True)
    # cap of the rerun after the role switch: None = max_rounds (the full rerun)
    switch_rounds: Optional[int] = identity()
    seed_k: int = identity(5)  # passages retrieved with the claim itself for the seed pool (Appendix J's example)
    redundancy_limit: float = identity(0.70)  # P-RAG early exits (Appendix I)
    relevance_gain: float = identity(0.05)
    confidence_floor: float = identity(0.10)
    split_decision: str = identity("chief-justice")
    chief_justice: int = identity(1)  # the judge seat (1-based) that breaks a three-way split
    # An Inconclusive panel: "nee" the dataset's not-enough-information label, or Supported (the paper's burden
    # of refutation) on a dataset without one; "supported": always Supported, the paper's.
    inconclusive: str = identity("nee")
    # Per role group; None: the paper's (COURTROOM_TEMPERATURES), or the run's temperature when one was given.
    counsel_temperature: Optional[float] = identity()
    court_temperature: Optional[float] = identity()
    judge_temperature: Optional[float] = identity()
    witness_temperature: Optional[float] = identity()
    critic_temperature: Optional[float] = identity()
    # Per role within a group; None: the group's (heterogeneous agents).
    plaintiff_temperature: Optional[float] = identity()
    defense_temperature: Optional[float] = identity()
    judge_temperatures: Optional[Tuple[float, ...]] = identity()  # one per judge seat

    @property
    def temperatures(self) -> Dict[str, float]:
        """{role group: sampling temperature} of the courtroom's roles."""
        return {role: COURTROOM_TEMPERATURES[role] if getattr(self, f"{role}_temperature") is None
                else getattr(self, f"{role}_temperature") for role in COURTROOM_TEMPERATURES}

    def temperature_of(self, role: str) -> float:
        """The sampling temperature of one role: plaintiff, defense, court, critic, witness or judge_<seat>."""
        groups = self.temperatures
        if role in ("plaintiff", "defense"):
            own = getattr(self, f"{role}_temperature")
            return groups["counsel"] if own is None else own
        if role.startswith("judge_"):
            seat = int(role.split("_")[1]) - 1
            seats = self.judge_temperatures or ()
            return seats[seat] if seat < len(seats) else groups["judge"]
        return groups[role]


@dataclass(frozen=True)
class Retrieval:
    """Retrieving each claim's evidence from its own knowledge store with HerO's strategy (docs/retrieval.md);
    HerO's numbers by default where one 40 GB GPU allows (docs/FIDELITY.md, "Retrieval (HerO)")."""
    # DIR/<claim_id>.json in AVeriTeC's layout; None: no retrieval of our own
    knowledge_store: Optional[str] = identity()
    missing_store: str = identity("error")  # error | skip: a claim without a store file gets no evidence, counted
    retrieve_only: bool = False  # stop once the evidence is saved (and scored where the split has gold pairs)
    hyde_docs: int = identity(8)  # HyDE-FC articles per claim (HerO's n=8)
    hyde_max_tokens: int = identity(512)  # tokens per article (HerO's)
    hyde_temperature: float = identity(0.7)  # HerO's sampling of the articles (top_p 1.0)
    bm25_k: Optional[int] = identity(10000)  # sentences BM25 passes to re-ranking (HerO's, on every device)
    query_instruction: Optional[str] = identity()  # text before each query the encoder embeds; None: the encoder's own
    rerank_k: int = identity(10)  # evidence items per claim (HerO's top 10)
    context: int = identity(0)  # neighbouring sentences of the page on each side of an answer (0: HerO's code)
    few_shot: int = identity(10)  # question-generation examples chosen by BM25 (HerO's 10)
    # labelled split whose golden pairs are the examples; None: train (HerO's)
    few_shot_split: Optional[str] = identity()
    question_max_tokens: int = identity(64)  # HerO allows 512 and keeps the text up to the first "?" (ours)
    embedding_cache_mb: int = 2048  # the embedding cache directory at most (MB); past it the oldest-used go first


@dataclass(frozen=True)
class DebateRetrieval:
    """--debate-retrieval: DebateCV's Debaters search the claim's source during the debate (ours, the DebateCV paper's
    future work; docs/debate_retrieval.md); the bounds are debate.methods.debate_retrieval.Limits'."""
    debate_retrieval: bool = identity(False)
    debate_top_k: int = identity(3)  # passages each query returns (the courtroom's --top-k)
    debate_novelty_threshold: float = identity(0.20)  # the courtroom's --novelty-threshold
    admit_per_round: int = identity(2)  # passages admitted per claim and round, both sides together (ours)
    admit_per_claim: int = identity(6)  # passages admitted per claim in the whole debate (ours)
    query_max_words: int = identity(32)  # a query is cut to its first words (ours)


@dataclass(frozen=True)
class Madr:
    madr_iterations: int = identity(3)  # revisions at most (Algorithm 1's N); ours: the paper does not give it
    madr_temperature: float = identity(0.0)  # MADR's four roles, whatever the run's; ours: the paper does not say
    self_refine_iterations: int = identity(4)  # --task explain --method self-refine: revisions at most; ours


@dataclass(frozen=True)
class Models:
    """Model paths (HF directory or .gguf file, or DEMO_MODEL); None: --model, else on the demo split the embedded
    Gemma 3 270M (another split refuses to guess: `_fill_models`)."""
    model: Optional[str] = None  # every agent not named below; what the roles really used is in their own fields
    debater_model: Optional[str] = identity()
    moderator_model: Optional[str] = identity()
    defense_model: Optional[str] = identity()  # None: debater_model
    judge_models: Optional[Tuple[str, ...]] = identity()  # None: moderator_model three times
    court_model: Optional[str] = identity()  # courtroom's presiding judge; None: moderator_model
    # courtroom's critic, argument miner, consistency analyzer; None: moderator_model
    critic_model: Optional[str] = identity()
    witness_model: Optional[str] = identity()  # courtroom's expert witness; None: debater_model
    refine_model: Optional[str] = identity()  # None: moderator_model
    moderator_adapter: Optional[str] = identity()
    use_4bit: Optional[bool] = identity(None)  # None: NF4 on CUDA, full precision on a CPU; True/False: on any device
    # the weights' (or 4-bit's compute) dtype; None: bf16 on CUDA, float32 on a CPU (models.run_dtype says why).
    # config.json says the dtype in effect, so a run resumed in another is told apart.
    dtype: Optional[str] = identity(None)
    device_map: Optional[str] = None  # "auto": each model spread over the node's GPUs (CUDA only); None: one GPU


@dataclass(frozen=True)
class Generation:
    batch_size: int = 8  # claims verified together (ours)
    temperature: Optional[float] = identity()  # None: the method's (PAPER_TEMPERATURE; PROClaim's methods: per role)
    top_p: float = identity(1.0)
    seed: int = identity(0)
    trials: int = 1
    max_new_tokens: Optional[int] = identity()  # None: FULL_TURN, DEMO_TURN on the demo split
    max_rounds: Optional[int] = identity()  # None: ROUNDS of the method, else 3
    structured: bool = identity(True)
    reuse_cache: bool = True
    continuous: bool = True  # claims in progress share model calls turn by turn (ours)
    compile: Optional[bool] = None  # the decode step compiled, CUDA graphs on CUDA (ours); None: on CUDA only
    # the run's memory budget (debate/engine/kv_pool.py), decided once the weights are loaded (ours): this share of
    # the card's capacity less the weights on CUDA, half of it of the RAM then available on a CPU; 0: none
    gpu_memory_fraction: float = 0.9
    memory_gb: Optional[float] = None  # the budget in GiB on any device instead (ours)
    max_context: Optional[int] = identity()  # a conversation's longest context; None: the model's window (ours)
    # prompt tokens a decode step carries beside its decode rows at most (debate/engine/decode_batch.py; ours)
    prefill_tokens: int = 512
    # CPU threads of the model calls; None: OMP_NUM_THREADS where set, else the job's allocation (affinity, cgroup
    # quotas), or where the process may use the whole host, the CPUs other work leaves free (debate/pipeline/threads.py)
    threads: Optional[int] = None


@dataclass(frozen=True)
class Output:
    # None: runs/<split>-<evidence>-<method>[-madr], runs/<split>-<evidence>-explain-<method>
    output_dir: Optional[str] = None
    overwrite: bool = False


@dataclass(frozen=True)
class RunConfig:
    data: Data = field(default_factory=Data)
    method: Method = field(default_factory=Method)
    models: Models = field(default_factory=Models)
    generation: Generation = field(default_factory=Generation)
    courtroom: Courtroom = field(default_factory=Courtroom)
    retrieval: Retrieval = field(default_factory=Retrieval)
    debate: DebateRetrieval = field(default_factory=DebateRetrieval)
    madr: Madr = field(default_factory=Madr)
    output: Output = field(default_factory=Output)


GROUPS: Dict[str, Any] = {f.name: f.type for f in fields(RunConfig)}  # group -> its dataclass
GROUP_OF = {f.name: group for group, cls in GROUPS.items() for f in fields(cls)}  # setting -> its group
IDENTITY_KEYS = tuple(f.name for cls in GROUPS.values() for f in fields(cls) if f.metadata.get("identity")) \
    + RECORDED_IDENTITY


def defaults() -> Dict[str, Any]:
    """{setting: default} of every field, flat; the CLI's flags take theirs from here."""
    return to_dict(RunConfig(), plain=False)


def to_dict(config: "RunConfig", plain: bool = True) -> Dict[str, Any]:
    """Every setting of `config` flat, by name; `plain`: as JSON holds it (tuples as lists)."""
    flat = {name: value for group in GROUPS for name, value in asdict(getattr(config, group)).items()}
    if plain:
        flat = {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}
    return flat


def _from_flat(settings: Dict[str, Any]) -> "RunConfig":
    return RunConfig(**{group: cls(**{f.name: settings[f.name] for f in fields(cls) if f.name in settings})
                        for group, cls in GROUPS.items()})


def save(config: "RunConfig", path: Union[str, os.PathLike]) -> None:
    Path(path).write_text(json.dumps(to_dict(config), indent=2) + "\n", encoding="utf-8")


def load(path: Union[str, os.PathLike]) -> "RunConfig":
    """The RunConfig of a config.json (a run directory's, old ones included): keys that are no setting
    (versions, models, precision, ...) are skipped, settings it leaves out get their defaults. A run's
    config.json says `use_4bit` as it really was (false on a CPU unless --4bit), not as asked."""
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    return build(**{k: v for k, v in saved.items() if k in GROUP_OF})


def _value(value: Any) -> Any:
    """A setting as the config holds it: paths as strings, sequences as tuples (the config is frozen)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return tuple(_value(v) for v in value)
    return value


def build(**settings: Any) -> "RunConfig":
    """The RunConfig of `settings` (flat, by field name; the rest take their defaults): checked, and every
    default that depends on other settings filled in. Raises ConfigError naming the flag.

    Building a built config's settings again (`build(**to_dict(config))`) gives the same config.
    """
    unknown = sorted(set(settings) - set(GROUP_OF))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; the settings are the flags' names: "
                          f"{', '.join(GROUP_OF)}")
    s = dict(defaults(), **{k: _value(v) for k, v in settings.items()})
    temperature_given = s["temperature"] is not None  # the courtroom roles' temperatures follow it then
    method, courtroom = s["method"], s["method"] in COURTROOM_METHODS
    explaining = s["task"] == "explain"
    if s["task"] not in TASKS:
        raise ConfigError(f"--task must be one of {', '.join(TASKS)}, not {s['task']!r}")
    if explaining and method not in EXPLAIN_METHODS:
        raise ConfigError(f"--task explain takes --method {', '.join(EXPLAIN_METHODS)}, not {method!r}")
    if explaining and s["refine"] != "none":
        raise ConfigError("--refine refines a verification method's justification; under --task explain, "
                          "MADR is --method madr")
    if not explaining and method not in METHOD_NAMES:
        raise ConfigError(f"--method must be one of {', '.join(METHOD_NAMES)}, not {method!r}"
                          + (" (it is a method of --task explain)" if method in EXPLAIN_METHODS else ""))
    if s["max_new_tokens"] is None:
        s["max_new_tokens"] = DEMO_TURN if s["split"] == DEMO_SPLIT else FULL_TURN
    if s["max_rounds"] is None:
        s["max_rounds"] = NO_PRAG_ROUNDS if method == "courtroom" and not s["prag"] else ROUNDS.get(method, 3)
    if s["switch_rounds"] is None:
        # The rerun is the full debate again under the primary's cap and rules (2.7; the authors'
        # main_pipeline.py reruns with the same cap); a smaller --switch-rounds is an ablation.
        s["switch_rounds"] = s["max_rounds"]
    if s["temperature"] is None:
        s["temperature"] = EXPLAIN_TEMPERATURE if explaining else TEMPERATURE.get(method, PAPER_TEMPERATURE)
    _check(s)
    for role, paper in COURTROOM_TEMPERATURES.items():
        name = f"{role}_temperature"
        if s[name] is not None and s[name] < 0:
            raise ConfigError(f"--{role}-temperature must be >= 0")
        if courtroom and s[name] is None:
            s[name] = s["temperature"] if temperature_given else paper
    for name in ("plaintiff_temperature", "defense_temperature"):
        if s[name] is not None and s[name] < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0")
    if s["judge_temperatures"] is not None and any(t < 0 for t in s["judge_temperatures"]):
        raise ConfigError("--judge-temperatures must be >= 0")
    _fill_data(s)
    _check_retrieval(s)
    _check_debate_retrieval(s)
    if s["output_dir"] is None:
        suffix = "-madr" if s["refine"] == "madr" else ""
        dataset = "" if s["dataset"] == "averitec" else f"{s['dataset']}-"
        task = "explain-" if explaining else ""
        s["output_dir"] = f"runs/{dataset}{s['split']}-{s['evidence']}-{task}{method}{suffix}"
    _fill_models(s)
    if s["single_judge"]:
        s["judge_models"] = s["judge_models"][:1]  # ablation A2: the panel is its first seat alone
    judges = len(s["judge_models"])
    if s["judge_temperatures"] is not None and len(s["judge_temperatures"]) > judges:
        raise ConfigError(f"--judge-temperatures takes one temperature per judge seat ({judges}), "
                          f"got {len(s['judge_temperatures'])}")
    return _from_flat(s)


def _fill_data(s: Dict[str, Any]) -> None:
    """The dataset's default evidence condition, and a refusal of a condition or split it cannot offer."""
    from debate.data import datasets  # the readers import no torch; loaded here so the config's import stays light

    if s["dataset"] not in datasets.NAMES:
        raise ConfigError(f"--dataset must be one of {', '.join(datasets.NAMES)}, not {s['dataset']!r}")
    dataset = datasets.get(s["dataset"])
    if s["split"] == DEMO_SPLIT and s["dataset"] != "averitec":
        raise ConfigError(f"--split demo is AVeriTeC's embedded demo set; {s['dataset']} has the splits "
                          f"{', '.join(dataset.splits or ('DATA_DIR/<split>',))}")
    if s["evidence"] is None:
        explain = s["task"] == "explain" and dataset.explain_condition
        s["evidence"] = explain or dataset.default_condition  # PolitiHop explained: the ruling, as MADR's runs
    if s["split"] == DEMO_SPLIT and s["evidence"] == "retrieved":
        s["evidence"] = "golden"  # the demo set has no retrieved evidence
    if s["evidence"] not in dataset.conditions:
        raise ConfigError(f"--evidence must be one of {', '.join(dataset.conditions)} on {s['dataset']}, "
                          f"not {s['evidence']!r}")


MODEL_FIELDS = ("model", "debater_model", "moderator_model", "defense_model", "court_model", "critic_model",
                "witness_model", "refine_model")


def no_model(split: str, missing: str) -> str:
    """The one line refusing a real split that no model was named for (the CLIs' and the API's)."""
    return (f"--split {split}: no {missing} given, and the embedded model is Gemma 3 270M, a base model for the demo "
            f"whose verdicts on real claims mean little; give --model PATH (a Hugging Face directory or a .gguf "
            f"file), or --model {DEMO_MODEL} to run the embedded model on {split} anyway")


def _fill_models(s: Dict[str, Any]) -> None:
    """Every model setting the user left out: --model, else the embedded default, which only the demo split takes
    unasked (a path of `demo` names it on any split); found only when needed."""
    embedded = None

    def demo_path() -> str:
        nonlocal embedded
        if embedded is None:
            from debate.engine import errors, gguf  # torch: only when the embedded default is really needed

            try:
                embedded = gguf.default_model_path()
            except errors.ModelLoadError as err:
                raise ConfigError(str(err)) from None
        return embedded

    base = s["model"]
    if not (s["debater_model"] and s["moderator_model"]):  # some role takes --model's path, or the default
        if not base and s["split"] != DEMO_SPLIT:
            missing = "--model" if not (s["debater_model"] or s["moderator_model"]) else \
                "--moderator-model (nor --model)" if s["debater_model"] else "--debater-model (nor --model)"
            raise NoModel(no_model(s["split"], missing))
        if base in (None, DEMO_MODEL):
            base = demo_path()
    for name in MODEL_FIELDS[1:]:
        if s[name] == DEMO_MODEL:
            s[name] = demo_path()
    if s["judge_models"]:
        s["judge_models"] = tuple(demo_path() if m == DEMO_MODEL else m for m in s["judge_models"])
    s["debater_model"] = s["debater_model"] or base
    s["moderator_model"] = s["moderator_model"] or base
    s["defense_model"] = s["defense_model"] or s["debater_model"]
    s["judge_models"] = s["judge_models"] or (s["moderator_model"],) * MAX_JUDGES
    s["refine_model"] = s["refine_model"] or s["moderator_model"]
    s["court_model"] = s["court_model"] or s["moderator_model"]
    s["critic_model"] = s["critic_model"] or s["moderator_model"]
    s["witness_model"] = s["witness_model"] or s["debater_model"]


POSITIVE = ("batch_size", "prefill_tokens", "max_new_tokens", "max_rounds", "voters", "top_k", "madr_iterations",
            "trials", "evidence_k", "self_refine_iterations", "hyde_max_tokens", "rerank_k", "question_max_tokens")
FRACTIONS = ("novelty_threshold", "novelty_stop", "plateau_delta", "admit_threshold", "dispute_threshold",
             "gpu_memory_fraction")


def _check_retrieval(s: Dict[str, Any]) -> None:
    """Refuse retrieval settings that make no run (the store's own problems are the stage's to name)."""
    if s["missing_store"] not in ("error", "skip"):
        raise ConfigError(f"--missing-store must be error or skip, not {s['missing_store']!r}")
    for name in ("hyde_docs", "context", "few_shot", "embedding_cache_mb"):
        if s[name] < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 0")
    if s["hyde_temperature"] < 0:
        raise ConfigError("--hyde-temperature must be >= 0")
    if s["bm25_k"] is not None and s["bm25_k"] < s["rerank_k"]:
        raise ConfigError("--bm25-k must be at least --rerank-k (BM25 passes its best to re-ranking)")
    if s["knowledge_store"] is None and s["retrieve_only"]:
        raise ConfigError("--retrieve-only retrieves from --knowledge-store DIR; give one")
    if s["knowledge_store"] is not None:
        if s["evidence"] != "retrieved" and not s["debate_retrieval"]:
            raise ConfigError(f"--knowledge-store retrieves the evidence: it runs with --evidence retrieved, "
                              f"not {s['evidence']}")
        if s["retrieved_file"] is not None:
            raise ConfigError("--knowledge-store and --retrieved-file are two sources of retrieved evidence; give one "
                              "(a store's saved file is OUTPUT_DIR/retrieved.jsonl, for --retrieved-file later)")
        if s["corpus"] is not None and s["method"] in COURTROOM_METHODS:
            raise ConfigError("--knowledge-store and --corpus are two corpora for the courtroom; give one")


def _check_debate_retrieval(s: Dict[str, Any]) -> None:
    """Refuse --debate-retrieval settings that make no run: another method, no source to search, bounds out of range."""
    from debate.data import datasets

    for name in ("debate_top_k", "admit_per_round", "admit_per_claim", "query_max_words"):
        if s[name] < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= s["debate_novelty_threshold"] <= 1:
        raise ConfigError("--debate-novelty-threshold must be in [0, 1]")
    if not s["debate_retrieval"]:
        return
    if s["task"] != "verify" or s["method"] != "debatecv":
        raise ConfigError(f"--debate-retrieval is DebateCV's (--method debatecv), not {s['method']!r}")
    if s["claim_evidence_only"]:
        raise ConfigError("--debate-retrieval searches a store or a corpus; --claim-evidence-only forbids both")
    if not (s["knowledge_store"] or s["corpus"] or datasets.get(s["dataset"]).corpus is not None):
        raise ConfigError(f"--debate-retrieval needs something to search: --knowledge-store DIR (each claim's own "
                          f"store), or --corpus FILE (JSONL passages); {s['dataset']} has no corpus of its own")


def _check(s: Dict[str, Any]) -> None:
    """Refuse values that make no run; each message names the flag as `run_debate.py` spells it."""
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if s["dtype"] not in (None, "float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype must be float32, bfloat16 or float16, not {s['dtype']!r}")
    if s["device_map"] not in (None, "auto"):
        raise ConfigError(f"--device-map must be auto, not {s['device_map']!r}")
    for name, choices in (("refine", ("none", "madr")),
                          ("split_decision", ("chief-justice", "conflicting")), ("inconclusive", ("nee", "supported"))):
        if s[name] not in choices:
            raise ConfigError(f"{flag(name)} must be one of {', '.join(choices)}, not {s[name]!r}")
    for name in POSITIVE:
        if s[name] < 1:
            raise ConfigError(f"{flag(name)} must be at least 1")
    if s["limit"] is not None and s["limit"] < 1:
        raise ConfigError("--limit must be at least 1")
    if s["threads"] is not None and s["threads"] < 1:
        raise ConfigError("--threads must be at least 1")
    if s["max_context"] is not None and s["max_context"] < 1:
        raise ConfigError("--max-context must be at least 1")
    if s["memory_gb"] is not None and not s["memory_gb"] > 0:
        raise ConfigError("--memory-gb must be above 0")
    if s["temperature"] < 0 or not 0 < s["top_p"] <= 1:
        raise ConfigError("--temperature must be >= 0 and --top-p in (0, 1]")
    if s["madr_temperature"] < 0:
        raise ConfigError("--madr-temperature must be >= 0")
    if s["method"] == "majority" and s["temperature"] == 0:
        raise ConfigError("--method majority needs sampling (--temperature > 0): greedy voters would all give the "
                          "same answer")
    judges = s["judge_models"]
    if judges is not None and len(judges) > MAX_JUDGES:
        raise ConfigError(f"--judge-models takes at most {MAX_JUDGES} paths, got {len(judges)}")
    for name in FRACTIONS:
        if not 0 <= s[name] <= 1:
            raise ConfigError(f"{flag(name)} must be in [0, 1]")
    if s["dispute_threshold"] > s["admit_threshold"]:
        raise ConfigError("--dispute-threshold must not be above --admit-threshold")
    if len(s["reflection_weights"]) != 3:
        raise ConfigError("--reflection-weights takes three weights: LOGIC NOVELTY REBUTTAL")
    if any(w < 0 for w in (*s["reflection_weights"], s["vote_weight"], s["quality_weight"])):
        raise ConfigError("--reflection-weights, --vote-weight and --quality-weight must not be negative")
    if s["switch_rounds"] < 1 or s["seed_k"] < 0:
        raise ConfigError("--switch-rounds must be at least 1 and --seed-k at least 0")
    if not 0 <= s["redundancy_limit"] <= 1 or not 0 <= s["confidence_floor"] <= 1:
        raise ConfigError("--redundancy-limit and --confidence-floor must be in [0, 1]")
    if s["single_judge"]:
        judges = (judges or [None])[:1]
    if s["method"] == "courtroom" and not 1 <= s["chief_justice"] <= len(judges or [None] * MAX_JUDGES):
        raise ConfigError("--chief-justice must name one of the judge seats (1 to the number of --judge-models)")
