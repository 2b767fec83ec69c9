"""One honest tiny CPU run shared by the judge tests (a few seconds; each further run costs as much)."""

import pytest

from tests.judge.runs import train
from tests.once import once_per_run


@pytest.fixture(scope="session")
@once_per_run
def honest(tmp_path_factory):
    return train(tmp_path_factory.mktemp("honest"))
