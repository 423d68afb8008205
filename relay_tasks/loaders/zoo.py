"""Built-in models from ``tvm.relay.testing``: real network shapes with seeded random weights.

They need no download, so the CLI and the tests can always run; ``resnet-50`` is the default.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm.ir import IRModule

from .._deferred import import_alone
from ..errors import ModelError

DEFAULT_MODEL = "resnet-50"

Workload = tuple[IRModule, dict[str, tvm.nd.NDArray]]


def _resnet(layers: int) -> Callable[[], Workload]:
    def build() -> Workload:
        resnet = import_alone("tvm.relay.testing.resnet")

        return resnet.get_workload(num_layers=layers, batch_size=1)  # type: ignore[no-any-return]

    return build


def _vgg(layers: int) -> Callable[[], Workload]:
    def build() -> Workload:
        vgg = import_alone("tvm.relay.testing.vgg")

        return vgg.get_workload(num_layers=layers, batch_size=1)  # type: ignore[no-any-return]

    return build


def _mobilenet() -> Workload:
    mobilenet = import_alone("tvm.relay.testing.mobilenet")

    return mobilenet.get_workload(batch_size=1)  # type: ignore[no-any-return]


def _densenet() -> Workload:
    densenet = import_alone("tvm.relay.testing.densenet")

    return densenet.get_workload(densenet_size=121, batch_size=1)  # type: ignore[no-any-return]


def _squeezenet() -> Workload:
    squeezenet = import_alone("tvm.relay.testing.squeezenet")

    return squeezenet.get_workload(batch_size=1)  # type: ignore[no-any-return]


def _inception_v3() -> Workload:
    inception_v3 = import_alone("tvm.relay.testing.inception_v3")

    return inception_v3.get_workload(batch_size=1)  # type: ignore[no-any-return]


def _dcgan() -> Workload:
    dcgan = import_alone("tvm.relay.testing.dcgan")

    return dcgan.get_workload(batch_size=1)  # type: ignore[no-any-return]


MODELS: dict[str, Callable[[], Workload]] = {
    "resnet-18": _resnet(18),
    "resnet-34": _resnet(34),
    "resnet-50": _resnet(50),
    "resnet-101": _resnet(101),
    "mobilenet": _mobilenet,
    "vgg-11": _vgg(11),
    "vgg-16": _vgg(16),
    "densenet-121": _densenet,
    "squeezenet": _squeezenet,
    "inception-v3": _inception_v3,
    "dcgan": _dcgan,
}


def zoo_names() -> list[str]:
    """The names :func:`load_zoo_model` accepts."""
    return list(MODELS)


def load_zoo_model(name: str) -> Workload:
    """Build a built-in model: ``(IRModule, params)``."""
    try:
        build = MODELS[name]
    except KeyError:
        raise ModelError(
            f"unknown built-in model {name!r}; choose one of {', '.join(MODELS)}"
        ) from None
    return build()
