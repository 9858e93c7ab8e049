"""What to do when a test's outside resource (shared data, WordNet) is absent."""
import os
from pathlib import Path

import pytest


def missing(reason):
    """Skip on a developer's machine; fail in CI, where .ci/run installs WordNet and shared/ is beside the clone."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must have it)")
    pytest.skip(reason)


def averitec_dir():
    """The shared AVeriTeC folder: $DEBATECV_SHARED_DATA (the data folder or its averitec/), else ../shared."""
    env = os.environ.get("DEBATECV_SHARED_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return base if (base / "dev.json").is_file() else base / "averitec"
