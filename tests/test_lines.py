"""A run's lines: every module logs under `debate`; progress.lines prints them (or hands them to a caller) for the
length of a block, and nothing stays attached after it."""
import logging

import pytest

from debate.pipeline import progress

RUN = logging.getLogger("debate.pipeline.runner")
ENGINE = logging.getLogger("debate.engine.models")


def test_lines_print_info_on_stdout_warnings_on_stderr_and_no_detail(capsys):
    with progress.lines():
        RUN.info("3 claims, 1 already done in OUT, 2 to go")
        RUN.warning("warning: a store may need more memory")
        ENGINE.debug("tokenizer has no chat template; using the plain '### Role' fallback")
    RUN.info("said after the block")
    out, err = capsys.readouterr()
    assert out == "3 claims, 1 already done in OUT, 2 to go\n"  # the message alone: no level, no logger name
    assert err == "warning: a store may need more memory\n"


def test_a_block_leaves_no_handler_and_its_level_as_it_found_it():
    logger = logging.getLogger("debate")
    before = (list(logger.handlers), logger.level)
    said = []
    with pytest.raises(RuntimeError):
        with progress.lines(said.append, said.append):
            with progress.lines(said.append, said.append):  # two at once: two handlers, each line twice
                RUN.info("twice")
            RUN.info("once")
            raise RuntimeError("the run failed")
    assert said == ["twice", "twice", "once"] and (list(logger.handlers), logger.level) == before


def test_quiet_drops_a_ranks_lines_and_keeps_its_warnings():
    said, warned = [], []
    with progress.lines(said.append, warned.append):
        with progress.quiet():
            RUN.info("rank 1's line")
            RUN.warning("rank 1's warning")
        RUN.info("after")
    assert said == ["after"] and warned == ["rank 1's warning"]
