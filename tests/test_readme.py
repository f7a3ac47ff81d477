"""The README and the documentation under ``docs/`` say what runs.

Every Python block of ``README.md`` and ``docs/*.md`` is executed as written, on CPU, with these
substitutions that put it on this machine: the GPU becomes the CPU (``accelerator="gpu"``/
``"cuda"``, ``torch.device("cuda")``), the Trainer stops after two steps and stays quiet, a
multi-GPU Trainer is built but not fitted, compiled blocks and models use the ``aot_eager``
backend, and the names a block leaves to the reader (``model``, ``dm``, ``loader``,
``optimizer``, ``loss_fn``, and ``OffloadConfig``/``OffloadSession`` where a block continues the
one before it) are bound to a small classifier and its data. Every shell command
names a Makefile target or a module that exists, and parses with that module's own argument
parser when it has one. Every relative link resolves, to a heading too when it names one, and
the README stays a short user's document.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import lightning.pytorch
import pytest
import torch
from lightning.fabric import Fabric
from lightning.pytorch import LightningDataModule, LightningModule
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *DOCS]
LINKED = [
    *DOCUMENTS,
    ROOT / "bench" / "README.md",
    ROOT / "bench" / "results" / "journal.md",
]  # links, commands


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), flags=re.MULTILINE | re.DOTALL)


PYTHON_BLOCKS = [
    (path, index, block) for path in DOCUMENTS for index, block in enumerate(blocks(path, "python"))
]


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(64, 32, generator=generator), torch.randint(0, 4, (64,))
    )


class Data(LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 8

    def train_dataloader(self):
        return torch.utils.data.DataLoader(dataset(), batch_size=self.batch_size)


SUBSTITUTIONS = [
    ('accelerator="gpu"', 'accelerator="cpu"'),
    ('accelerator="cuda"', 'accelerator="cpu"'),
    ('torch.device("cuda")', 'torch.device("cpu")'),
    (".compile()", '.compile(backend="aot_eager")'),
    ("torch.compile(block)", 'torch.compile(block, backend="aot_eager")'),
    (
        'whole_model_compile="experimental"',
        'whole_model_compile="experimental", whole_model_backend="aot_eager"',
    ),
]


def on_cpu(source: str) -> str:
    for text, replacement in SUBSTITUTIONS:
        source = source.replace(text, replacement)
    return source


def quick_trainer(**options):
    quiet = {"max_steps": 2, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    if options.get("devices", 1) != 1 or "num_nodes" in options:  # a multi-GPU example: build, don't fit
        options |= {"devices": 2, "num_nodes": 1}
    return lightning.pytorch.trainer.trainer.Trainer(**(quiet | options))


def test_the_readme_has_python_examples():
    assert sum(path == README for path, _, _ in PYTHON_BLOCKS) >= 6


def test_the_readme_is_a_short_users_document():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    commits = [word for word in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", word)]
    assert commits == [], "commit hashes belong in bench/results, not in the README"
    assert re.findall(r"\b20\d\d-\d\d-\d\d", text) == [], "dated result names belong in bench/README.md"


def test_every_document_is_linked_from_the_readme():
    linked = {target for _, target in links(README)}
    assert {f"docs/{path.name}" for path in DOCS} <= {target.partition("#")[0] for target in linked}


def marks(block: str) -> list[pytest.MarkDecorator]:
    """Compiling and tuning take seconds: those blocks are left out of ``make test-fast``."""
    return [pytest.mark.slow] if "compile" in block or "EfficiencyTuner(" in block else []


@pytest.mark.parametrize(
    ("path", "index"),
    [
        pytest.param(path, index, id=f"{path.relative_to(ROOT)}-block{index + 1}", marks=marks(block))
        for path, index, block in PYTHON_BLOCKS
    ],
)
def test_example_runs_on_cpu(path, index, monkeypatch):
    source = blocks(path, "python")[index]
    monkeypatch.setattr(lightning.pytorch, "Trainer", quick_trainer)
    model = Model()
    namespace = {
        "Trainer": quick_trainer,
        "Fabric": Fabric,
        "model": model,
        "dm": Data(),
        "loader": torch.utils.data.DataLoader(dataset(), batch_size=8),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": nn.functional.cross_entropy,
        "torch": torch,
    }
    if "OffloadSession" in source:  # a plain loop: the bare network, no LightningModule
        from lightning_accudnn import OffloadConfig, OffloadSession

        namespace |= {"OffloadConfig": OffloadConfig, "OffloadSession": OffloadSession}
        namespace["model"] = model.layers
        namespace["optimizer"] = torch.optim.SGD(model.layers.parameters(), lr=0.1)
    exec(compile(on_cpu(source), f"{path.name} block {index + 1}", "exec"), namespace)
    if "compile" in source:
        torch.compiler.reset()


def links(path: Path) -> list[tuple[Path, str]]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    found = re.findall(r"\]\(([^)\s]+)\)", text)
    return [(path, target) for target in found if not re.match(r"[a-z]+:", target)]


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize(
    ("path", "target"),
    [link for path in LINKED for link in links(path)],
    ids=lambda value: value if isinstance(value, str) else str(value.relative_to(ROOT)),
)
def test_relative_link_resolves(path, target):
    file, _, anchor = target.partition("#")
    destination = (path.parent / file).resolve() if file else path
    assert destination.exists(), f"{path.relative_to(ROOT)} links to {target}, which does not exist"
    if anchor:
        assert anchor in anchors(destination), f"{path.relative_to(ROOT)}: no heading #{anchor} in {file}"


def commands(path: Path) -> list[list[str]]:
    found = []
    for block in blocks(path, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and re.match(r"^[A-Z_]+=", words[0]):  # an environment assignment
                words = words[1:]
            if words:
                found.append(words)
    return found


MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))


@pytest.mark.parametrize(
    "words",
    [words for path in LINKED for words in commands(path)],
    ids=lambda words: " ".join(words)[:60],
)
def test_shell_command_names_something_that_exists(words):
    program = words[0]
    if program == "make":
        assert set(words[1:]) <= MAKE_TARGETS, f"no such Makefile target: {words[1:]}"
        return
    if program in ("pip", "export") or words[1:3] == ["-m", "pip"]:
        # Not looked up: on Python < 3.12, finding ``pip`` makes setuptools' distutils shim give
        # way to the standard library's for the rest of the process, and a later test's Inductor
        # compile then fails importing setuptools.
        return
    if program == "accudnn":
        words = ["python", "-m", "lightning_accudnn", *words[1:]]
    assert program == "accudnn" or program.endswith("python"), f"unexpected command {program!r}"
    if words[1] != "-m":  # a script
        assert (ROOT / words[1]).is_file(), f"no such script: {words[1]}"
        return
    module, arguments = words[2], words[3:]
    assert importlib.util.find_spec(module) is not None, f"no such module: {module}"
    if module == "pytest":
        return
    if module == "lightning_accudnn":
        module = "lightning_accudnn.cli"
    parser = getattr(importlib.import_module(module), "build_parser", None)
    if parser is not None:
        parser().parse_args(arguments)
