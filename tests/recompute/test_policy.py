"""The policy option: config, both strategies, the CLI."""

from __future__ import annotations

import pytest

from lightning_accudnn import AccUDNNStrategy, OffloadConfig
from lightning_accudnn.cli import build_parser
from lightning_accudnn.strategy.ddp import AccUDNNDDPStrategy


def test_the_default_policy_is_auto_and_others_are_refused_by_name():
    assert OffloadConfig().policy == "auto"
    with pytest.raises(ValueError, match="'auto', 'swap', 'recompute'.*got 'fast'"):
        OffloadConfig(policy="fast")


def test_both_strategies_take_the_policy_keyword():
    assert AccUDNNStrategy("2GB", policy="recompute").offload_config.policy == "recompute"
    assert AccUDNNDDPStrategy(budget="2GB", policy="swap").offload_config.policy == "swap"
    with pytest.raises(ValueError, match="policy must be one of"):
        AccUDNNStrategy("2GB", policy="both")


def test_the_plan_command_takes_a_policy():
    args = ["plan", "torchvision:resnet18", "--batch-size", "8", "--budget", "4GB", "--gpu", "l4"]
    assert build_parser().parse_args(args).policy == "auto"
    assert build_parser().parse_args([*args, "--policy", "swap"]).policy == "swap"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*args, "--policy", "never"])
