"""fedfleet.Config: the C++ parser's keys, checks and messages, from Python."""
import pytest

import fedfleet
from conftest import run_cli


def test_keyword_arguments_resolve_to_full_keys():
    cfg = fedfleet.Config(rounds=30, **{"train.lr": 0.05})
    assert cfg["run.rounds"] == 30
    assert cfg["rounds"] == 30
    assert cfg["train.lr"] == 0.05
    cfg["coordinator.clients_per_round"] = 7
    assert cfg.to_dict()["coordinator"]["clients_per_round"] == 7


def test_an_ambiguous_bare_name_lists_the_keys_it_could_mean():
    # "seed" is run.seed only, "lr" is train.lr only; "name" is in several sections.
    with pytest.raises(fedfleet.ConfigError, match=r"name: ambiguous, give one of .*run\.name"):
        fedfleet.Config(name="x")


def test_a_bad_key_raises_the_message_the_command_prints(fedfleet_bin):
    p = run_cli(fedfleet_bin, "sim", "--set", "train.nosuch=1", check=False)
    assert p.returncode == 2
    prefix = "fedfleet sim: "
    assert p.stderr.startswith(prefix), p.stderr
    cli_message = p.stderr[len(prefix):].strip()
    assert "nosuch" in cli_message
    with pytest.raises(fedfleet.ConfigError) as e:
        fedfleet.Config(**{"train.nosuch": 1})
    assert str(e.value) == cli_message
    assert isinstance(e.value, ValueError)


def test_a_wrong_type_and_a_value_out_of_range_are_refused_with_the_key():
    with pytest.raises(fedfleet.ConfigError, match="run.rounds"):
        fedfleet.Config(**{"run.rounds": "many"})
    cfg = fedfleet.Config(**{"coordinator.clients_per_round": 5, "coordinator.quorum": 9,
                             "data.format": "synthetic"})
    with pytest.raises(fedfleet.ConfigError, match="quorum"):
        cfg.validate()


def test_save_and_load_give_an_equal_config_that_the_command_reads(tmp_path, fedfleet_bin):
    cfg = fedfleet.Config(rounds=2, **{"train.lr": 0.0123456789, "data.format": "synthetic",
                                       "sim.clients": 30, "coordinator.clients_per_round": 3,
                                       "model.local": ["fc3.*", "fc2.bias"], "run.name": "saved"})
    path = tmp_path / "saved.toml"
    cfg.save(path)
    again = fedfleet.Config.load(path)
    assert again == cfg
    assert again["train.lr"] == 0.0123456789
    assert again["model.local"] == ["fc3.*", "fc2.bias"]
    # The file is a config the command runs.
    p = run_cli(fedfleet_bin, "sim", "--config", str(path), "--db", str(tmp_path / "h.db"),
                "--progress", "off")
    assert "history:" in p.stdout
