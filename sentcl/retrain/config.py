"""params.yaml ``retrain:`` read once into a :class:`RetrainConfig`: the method (the transfer runs, one after the
other), the teacher a distill method learns from, the held-out share that selects and gates without labels, and
``retrain.transfer``, what its runs train with over ``transfer:`` (a distill run's steps: a nightly budget)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sentcl.params import ParamsError, as_overrides, dotted, one_of, read_section
from sentcl.retrain.agreement import RETRAIN_KEYS, AgreementConfig

# retrain.method: the transfer objectives run one after the other, each from the previous one's output.
RETRAIN_METHODS: dict[str, tuple[str, ...]] = {
    "contrastive": ("contrastive",),
    "tsdae": ("tsdae",),
    "tsdae+contrastive": ("tsdae", "contrastive"),
    # distill learns from params ``teacher.model``'s vectors of the domain text (the teacher stage writes them).
    "distill": ("distill",),
    "distill+contrastive": ("distill", "contrastive"),
}


@dataclass(frozen=True)
class RetrainConfig:
    """params.yaml ``retrain:``, checked as a whole."""

    method: str
    objectives: tuple[str, ...]  # the transfer runs, each from the previous one's output
    teacher: str | None  # params ``teacher.model``, when the method distils
    agreement: AgreementConfig  # the held-out share and how its pairs are drawn
    overrides: tuple[str, ...]  # retrain.transfer as overrides of params: what every stage of a retrain reads

    @classmethod
    def from_params(cls, params: Mapping[str, Any], method: str | None = None) -> RetrainConfig:
        """``method``: a run's own choice instead of ``retrain.method``."""
        chosen = chosen_method(params, method)
        return cls(
            chosen,
            RETRAIN_METHODS[chosen],
            retrain_teacher(params, chosen),
            AgreementConfig.from_params(params),
            tuple(retrain_overrides(params)),
        )


def retrain_method(params: Mapping[str, Any]) -> str:
    """params.yaml ``retrain.method`` (the only home of its default), checked."""
    section = read_section(
        params, "retrain", RETRAIN_KEYS, optional=RETRAIN_KEYS
    )  # the rest: AgreementConfig
    method = one_of(section.get("method"), "retrain.method", tuple(RETRAIN_METHODS))
    retrain_teacher(params, method)
    return method


def retrain_overrides(params: Mapping[str, Any]) -> list[str]:
    """params.yaml ``retrain.transfer``, what a retrain's runs train with over ``transfer:`` (a distill run's steps:
    a nightly budget of its own; the whole domain text), as ``--set`` overrides: ``transfer.distillation.steps=600``.
    Every key it names is a key of ``transfer:``."""
    overlay = read_section(params, "retrain", RETRAIN_KEYS)["transfer"]
    if not isinstance(overlay, Mapping):
        raise ParamsError(f"params.yaml: retrain.transfer must be a mapping over transfer:, got {overlay!r}")
    known = dotted(params.get("transfer") or {})
    for key in dotted(overlay):
        if key not in known:
            raise ParamsError(f"params.yaml: retrain.transfer.{key}: transfer.{key} is not in params.yaml")
    return as_overrides({"transfer": overlay}, params)


def chosen_method(params: Mapping[str, Any], method: str | None) -> str:
    """``method`` (a retrain run's own choice) or params.yaml ``retrain.method``; one of RETRAIN_METHODS."""
    method = method or retrain_method(params)
    if method not in RETRAIN_METHODS:
        raise ParamsError(f"method {method!r} is not one of {', '.join(RETRAIN_METHODS)}")
    return method


def retrain_teacher(params: Mapping[str, Any], method: str) -> str | None:
    """params.yaml ``teacher.model`` when ``method`` distils (None when it does not); a distill method with
    ``teacher.model: none`` is refused here, before any text is read or any model loaded."""
    if "distill" not in RETRAIN_METHODS.get(method, ()):
        return None
    # The section's own rules are sentcl.model.teacher.TeacherConfig's (check_params, the teacher stage); only the
    # model is read here.
    section = params.get("teacher")
    model = section.get("model") if isinstance(section, Mapping) else None
    if model in (None, "none"):
        raise ParamsError(
            f"params.yaml: retrain.method {method} distils from a teacher but teacher.model is {model or 'missing'} "
            "(set teacher.model: all-mpnet-base-v2, a model folder or a models:/ URI)"
        )
    return str(model)
