"""The packages import their public names on first use: each name resolves, to the object of
the module that defines it, and an unknown name is an AttributeError."""

import importlib

import pytest

PACKAGES = ("lightning_accudnn", "lightning_accudnn.ops", "lightning_accudnn.session")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_to_its_defining_module(package):
    module = importlib.import_module(package)
    assert module.__all__
    for name in module.__all__:
        value = getattr(module, name)
        if value is object:  # an alias of object (ops.runtime.StreamEvent): no module of its own
            continue
        assert value.__module__.startswith(package), (package, name, value.__module__)
        defined_in = importlib.import_module(value.__module__)
        assert getattr(defined_in, name) is value, (package, name)
        assert name in dir(module)


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error(package):
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018
