"""The run config: one source of the flags' defaults and the resume identity, frozen, saved and loaded as
config.json."""
import dataclasses
import json
from pathlib import Path

import pytest

from debate.pipeline import cli, config, records
from debate.pipeline.config import ConfigError


def built(**settings):
    return config.build(**dict({"split": "demo", "model": "m"}, **settings))


def test_every_flag_is_a_field_and_takes_its_default_from_it():
    parser = cli.run_parser()
    dests = {a.dest for a in parser._actions if a.dest not in ("help", "==SUPPRESS==")}
    defaults = config.defaults()
    assert dests == set(defaults)
    assert all(a.default == defaults[a.dest] for a in parser._actions if a.dest not in ("help", "==SUPPRESS=="))
    # The identity is the fields marked so (plus the prompts' hash a run records), not a list kept by hand.
    marked = {f.name for group in config.GROUPS.values() for f in dataclasses.fields(group)
              if f.metadata.get("identity")}
    assert set(config.IDENTITY_KEYS) == marked | {"prompts_hash", "labels"}
    assert {"seed", "temperature", "top_k", "judge_models", "moderator_adapter"} <= marked
    assert not {"limit", "batch_size", "output_dir", "overwrite", "trials", "model", "prompts"} & marked


def test_flags_build_the_same_config_as_python():
    flags = cli.parse_run_args(["--split", "demo", "--model", "m", "--method", "courtroom", "--judge-models", "a", "b",
                                "--reflection-weights", "0.5", "0.25", "0.25", "--temperature", "0.4"])
    python = built(method="courtroom", judge_models=["a", "b"], reflection_weights=[0.5, 0.25, 0.25], temperature=0.4)
    assert flags == python
    # Derived defaults are filled once, at build: the demo's turns, golden evidence, every role's temperature.
    assert (python.generation.max_new_tokens, python.generation.max_rounds, python.data.evidence) == (96, 10, "golden")
    assert python.courtroom.temperatures == dict.fromkeys(config.COURTROOM_TEMPERATURES, 0.4)
    assert python.output.output_dir == "runs/demo-golden-courtroom"
    assert python.models.judge_models == ("a", "b") and python.models.defense_model == "m"
    with pytest.raises(dataclasses.FrozenInstanceError):
        python.generation.seed = 3


def test_save_load_round_trip(tmp_path):
    for cfg in (built(method="courtroom", corpus=tmp_path / "p.jsonl", judge_models=["a", "b"], chief_justice=2),
                built(method="majority", voters=5, refine="madr", limit=2, prompts=tmp_path)):
        path = tmp_path / "config.json"
        config.save(cfg, path)
        assert config.load(path) == cfg
        assert config.build(**config.to_dict(cfg)) == cfg  # building a built config changes nothing
    assert json.loads(path.read_text())["prompts"] == str(tmp_path)  # paths are saved as strings


@pytest.mark.parametrize("settings, message", [
    ({"batch_size": 0}, "--batch-size must be at least 1"),
    ({"method": "majority", "temperature": 0}, "needs sampling"),
    ({"top_k": 3, "tpo_k": 2}, "unknown setting(s) tpo_k"),
    ({"method": "debate"}, "--method must be one of"),
    ({"evidence": "gold"}, "--evidence must be one of"),
])
def test_bad_settings_are_refused_with_the_flag_named(settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        built(**settings)


def a_done_run(tmp_path, cfg):
    out = tmp_path / "run"
    out.mkdir()
    (out / records.PREDICTIONS).write_text(json.dumps({"claim_id": 0, "label": "Supported"}) + "\n")
    config.save(cfg, out / records.CONFIG)
    return out


def test_a_changed_identity_field_refuses_a_resume_and_another_field_does_not(tmp_path):
    cfg = built(temperature=0.0)
    out = a_done_run(tmp_path, cfg)
    changed = dataclasses.replace(cfg, generation=dataclasses.replace(cfg.generation, seed=1))
    with pytest.raises(records.RunConflict, match=r"1 claims done with other settings \(seed: 0 -> 1\).*--overwrite"):
        records.check(out, config.to_dict(changed))
    for other in (dataclasses.replace(cfg, generation=dataclasses.replace(cfg.generation, batch_size=2, trials=1)),
                  dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, limit=5)),
                  dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, output_dir="elsewhere"))):
        assert set(records.check(out, config.to_dict(other))) == {0}


def test_a_config_json_written_before_the_config_type_still_loads_and_resumes(tmp_path):
    """What run_config(vars(args)) wrote: every flag flat (the courtroom's too, for a DebateCV run), plus
    what the run recorded (versions, models, precision)."""
    cfg = built(temperature=0.0, moderator_model="x", debater_model="x")
    old = dict(config.to_dict(cfg), counsel_temperature=0.0, court_temperature=0.0, judge_temperature=0.0,
               witness_temperature=0.0, critic_temperature=0.0, switch_rounds=2, precision="float32", use_4bit=False,
               versions={"python": "3.11"}, git_commit=None, models={"moderator": {"quantized": False}})
    for key in ("judge_models", "defense_model", "refine_model", "top_k", "voters", "madr_iterations", "dtype"):
        old.pop(key)
    out = tmp_path / "old"
    out.mkdir()
    (out / records.PREDICTIONS).write_text(json.dumps({"claim_id": 0}) + "\n")
    (out / records.CONFIG).write_text(json.dumps(old))
    loaded = config.load(out / records.CONFIG)
    assert loaded.generation == cfg.generation and loaded.models.moderator_model == "x"
    # Today's config.json of the same run leaves the courtroom out: those keys are not compared.
    from debate.pipeline import config_file, method_table
    now = config_file.config_json(cfg, method_table.model_roles(cfg), {"quantized": False, "dtype": "float32"})
    assert "counsel_temperature" not in now and set(records.check(out, now)) == {0}


def test_the_synthesis_stage_builds_its_run_from_the_same_type(tmp_path):
    import train_moderator
    from train import stages

    args = train_moderator.parse_args(["--split", "demo", "--model", "M", "--debater-model", "D", "--out",
                                       str(tmp_path), "--limit", "2", "--no-structured", "--overwrite"])
    synth = stages.synth_config(args)
    assert isinstance(synth, config.RunConfig)
    assert (synth.method.method, synth.data.evidence, synth.data.limit) == ("debatecv", "golden", 2)
    assert (synth.models.moderator_model, synth.models.debater_model) == ("M", "D")
    assert synth.output.output_dir == str(Path(tmp_path) / "debates") and synth.output.overwrite
    assert (synth.generation.max_new_tokens, synth.generation.temperature, synth.generation.structured) == \
        (96, 0.7, False)


# --- no model named on a real split (issue 49): the embedded 270M base model is the demo's, never a silent default ---

@pytest.fixture
def embedded(monkeypatch):
    """The embedded model's path, without assembling its GGUF."""
    from debate.engine import gguf

    monkeypatch.setattr(gguf, "default_model_path", lambda: "/cache/gguf/gemma-3-270m.gguf")
    return "/cache/gguf/gemma-3-270m.gguf"


@pytest.mark.parametrize("settings, missing", [({}, "no --model given"),
                                               ({"debater_model": "d"}, "no --moderator-model (nor --model) given"),
                                               ({"moderator_model": "m"}, "no --debater-model (nor --model) given"),
                                               ({"dataset": "jsonl"}, "no --model given")])
def test_a_real_split_without_a_model_stops_and_says_how_to_choose_the_demo_model(settings, missing, embedded):
    with pytest.raises(ConfigError) as refused:
        config.build(split="dev", **settings)
    line = str(refused.value)
    assert "\n" not in line and missing in line
    assert "270M" in line and "demo" in line and "--model demo" in line and "--model PATH" in line


def test_the_demo_model_is_taken_unasked_on_the_demo_split_only_and_by_name_anywhere(embedded):
    demo = config.build(split="demo")
    assert (demo.models.debater_model, demo.models.moderator_model) == (embedded, embedded)
    asked = config.build(split="dev", model="demo")
    assert asked.models.moderator_model == embedded and asked.models.judge_models == (embedded,) * 3
    # Any role's flag may name it; the others keep their own model.
    mixed = config.build(split="dev", model="m", moderator_model="demo", judge_models=["demo", "j"])
    assert (mixed.models.debater_model, mixed.models.moderator_model) == ("m", embedded)
    assert mixed.models.judge_models == (embedded, "j")
    both = config.build(split="dev", debater_model="d", moderator_model="m")  # every role named: nothing to guess
    assert (both.models.debater_model, both.models.refine_model) == ("d", "m")
    # A config.json of a run that took the default resumes: its roles hold the path itself.
    assert config.build(**config.to_dict(asked)) == asked


def test_the_cli_and_the_api_refuse_the_same_way(embedded, capsys):
    import debate

    with pytest.raises(SystemExit) as stop:
        cli.parse_run_args(["--split", "dev", "--data-dir", "d"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: --split dev: no --model given") and "Traceback" not in err
    with pytest.raises(ConfigError, match="--model demo"):
        debate.build(split="dev")
    with pytest.raises(ConfigError, match="--model demo"):
        debate.Verifier(debate.RunConfig())  # a Verifier's default split is dev: it would verify with the 270M


def test_training_refuses_the_same_trap_and_takes_demo_by_name(embedded, capsys):
    import train_moderator
    from train import settings as train_settings

    with pytest.raises(SystemExit) as stop:
        train_moderator.parse_args(["--split", "train", "--data-dir", "d"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "no --model given" in err and "--model demo" in err
    parsed = train_moderator.parse_args(["--split", "train", "--model", "demo", "--corrector-model", "c"])
    filled = train_settings.with_models(parsed, embedded)
    assert (filled.model, filled.debater_model, filled.corrector_model) == (embedded, embedded, "c")
    demo = train_moderator.parse_args(["--split", "demo"])
    assert train_settings.uses_demo_model(demo) and train_settings.with_models(demo, embedded).model == embedded
