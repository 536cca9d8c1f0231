"""TrainConfig's sections behind flat flags and YAML keys."""

import pytest

from trirace.config import FLAGS, TOP_LEVEL, TrainConfig, make_config
from trirace.errors import ConfigError


def test_every_flat_option_lands_in_its_section_and_reads_back():
    cfg = make_config(pp=1, dp=4, comm_policy="fifo", data="synthetic", checkpoint_dir="ck", lr=0.01, kill="1:2")
    assert (cfg.parallel.pp, cfg.parallel.dp, cfg.comm.policy, cfg.data.source) == (1, 4, "fifo", "synthetic")
    assert str(cfg.checkpoint.dir) == "ck" and cfg.optim.lr == 0.01 and cfg.faults.kill == (1, 2)
    flat = cfg.flat()
    assert set(flat) == {*TOP_LEVEL, *FLAGS}
    assert make_config(flat) == cfg  # the flat view is what make_config takes back


def test_a_yaml_file_may_be_flat_or_in_sections(tmp_path):
    flat, nested = tmp_path / "flat.yaml", tmp_path / "nested.yaml"
    flat.write_text("pp: 1\ncomm-policy: priority\nsteps: 3\n")
    nested.write_text("parallel:\n  pp: 1\ncomm:\n  policy: priority\nsteps: 3\n")
    assert make_config(config_file=flat) == make_config(config_file=nested)
    assert make_config({"dp": 1}, config_file=nested).parallel.dp == 1  # a flag joins its section


def test_errors_name_the_option_as_the_user_wrote_it():
    with pytest.raises(ConfigError, match=r"^comm_policy: Input should be"):
        make_config(comm_policy="nope")
    with pytest.raises(ConfigError, match=r"^micro_batches: Input should be greater than or equal to 1"):
        make_config(micro_batches=0)
    with pytest.raises(ConfigError, match=r"^no_such_flag: unknown option$"):
        make_config(no_such_flag=1)


def test_with_replaces_by_flat_name_and_leaves_the_rest():
    cfg = make_config(pp=2, dp=2)
    other = cfg.with_(comm_policy="blocking", steps=3)
    assert (other.comm.policy, other.steps, other.parallel) == ("blocking", 3, cfg.parallel)
    with pytest.raises(KeyError):
        cfg.with_(no_such_flag=1)


def test_a_config_crosses_processes_as_its_dump():
    cfg = make_config(model="gpt-test", pp=2, dp=1, straggler="1:0.5", topology="t.yaml")
    assert TrainConfig(**cfg.model_dump(mode="json")) == cfg
