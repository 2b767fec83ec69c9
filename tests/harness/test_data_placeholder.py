"""The `{data}` placeholder and the `prepare` job task: the judge, not the candidate, says where the shared
data lives (TEMPER_DATA, else ../shared/data beside the judge's home)."""

from pathlib import Path

from harness.settings import data_dir
from harness.spec import load_milestone, render_argv

REPO = Path(__file__).resolve().parents[2]


def test_data_placeholder_is_rendered_by_the_judge(tmp_path):
    argv = render_argv(["prepare", "--tokenizer-path", "{data}/tokenizers/minicpm4", "--out", "{job_dir}/shards"],
                       job_dir=tmp_path / "job", worktree=tmp_path, job_dirs={}, data=tmp_path / "data")
    assert argv == ["prepare", "--tokenizer-path", f"{tmp_path}/data/tokenizers/minicpm4", "--out", f"{tmp_path}/job/shards"]


def test_data_dir_is_temper_data_else_shared_beside_home(tmp_path, monkeypatch):
    monkeypatch.delenv("TEMPER_DATA", raising=False)
    assert data_dir(tmp_path / "home") == (tmp_path / "shared" / "data").resolve()
    monkeypatch.setenv("TEMPER_DATA", str(tmp_path / "elsewhere"))
    assert data_dir(tmp_path / "home") == (tmp_path / "elsewhere").resolve()


def test_long_horizon_has_a_prepare_job_feeding_its_train_job():
    m = load_milestone(REPO / "milestones" / "long-horizon.toml", root=REPO)
    prepare, train = m.job_gates()
    assert (prepare.task, prepare.argv[0], train.task, train.argv[0]) == ("prepare", "prepare", "train", "pretrain")
    assert "{job_dir:prepare}/shards" in train.argv and any("{data}" in a for a in prepare.argv)
