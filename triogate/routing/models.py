"""Which model group a requested model name means: exact, alias, or wildcard.

LiteLLM's three ways of naming a model, resolved in this order:

1. a model group (``model_name`` in ``model_list``);
2. an alias (``router_settings.model_group_alias``): the alias's group answers;
3. a wildcard deployment (``model_name: "*"`` or ``"openai/*"``, with
   ``litellm_params.model: openai/*``): the most specific pattern that matches wins, and
   the text the ``*`` matched is the model sent upstream.

A wildcard deployment's price is the config's when it gives one, else the bundled
``prices.json`` table's (list prices, see its ``about``), else zero.
"""

from __future__ import annotations

import json
import logging
import re
from decimal import Decimal
from importlib import resources
from typing import TYPE_CHECKING, final

import attrs

from triogate.config import Price
from triogate.config_litellm import priced_name, provider_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from triogate.config import Deployment, GatewayConfig

logger = logging.getLogger("triogate.routing")


@final
@attrs.frozen
class ModelRef:
    """A requested model, resolved.

    Attributes:
        group: the model group that serves it (a wildcard pattern for wildcards).
        model: the name to check key access against and, for a wildcard, to send on:
            the requested name for wildcards, the group otherwise.
    """

    group: str
    model: str

    @property
    def wildcard(self) -> bool:
        return "*" in self.group


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + "(.*)".join(re.escape(p) for p in pattern.split("*")) + "$",
                      re.DOTALL)


def _specificity(pattern: str) -> tuple[int, int]:
    """Longer literal text first; fewer stars first (``openai/*`` before ``*``)."""
    return (-len(pattern.replace("*", "")), pattern.count("*"))


@final
class ModelNames:
    """Resolves model names for one configuration (built once by ``app.py``)."""

    def __init__(self, config: GatewayConfig) -> None:
        self._groups = config.groups
        self._aliases = dict(config.router.aliases)
        self._hidden = config.router.hidden_aliases
        patterns = sorted((g for g in self._groups if "*" in g), key=_specificity)
        self._patterns = [(p, _regex(p)) for p in patterns]

    def resolve(self, name: str) -> ModelRef | None:
        """The group serving ``name``, or None when nothing does."""
        if name in self._groups and "*" not in name:
            return ModelRef(name, name)
        if name in self._aliases:
            group = self._aliases[name]
            return ModelRef(group, group)
        for pattern, regex in self._patterns:
            if regex.match(name):
                return ModelRef(pattern, name)
        return None

    def public_names(self) -> list[str]:
        """Groups (wildcards included) and visible aliases, for model lists."""
        return [*self._groups, *(a for a in self._aliases if a not in self._hidden)]

    @property
    def aliases(self) -> Mapping[str, str]:
        return self._aliases


def bind(deployment: Deployment, model: str | None) -> Deployment:
    """``deployment`` for the requested ``model``: a wildcard's ``*`` filled, its price set.

    Not a wildcard, or no model: the deployment unchanged.
    """
    if model is None or not deployment.wildcard:
        return deployment
    match = _regex(deployment.group).match(model)
    # No match: a wildcard fallback group of another pattern gets the whole name.
    captured = [model] if match is None else list(match.groups())
    if deployment.group == "*" and captured[0].startswith(f"{deployment.provider}/"):
        captured[0] = captured[0].removeprefix(f"{deployment.provider}/")
    parts = deployment.upstream_model.split("*")
    upstream = parts[0] + "".join(
        (captured[i] if i < len(captured) else "") + part for i, part in enumerate(parts[1:]))
    price = deployment.price if deployment.priced else table_price(upstream)
    if not deployment.priced and deployment.provider not in ("openai", "anthropic"):
        # LiteLLM's other provider names are listed as provider/model.
        listed = table_price(f"{deployment.provider}/{upstream}")
        price = listed if listed != Price() else price
    if price == Price() and not deployment.priced:
        _warn_unpriced(deployment, upstream)
    return attrs.evolve(deployment, upstream_model=upstream, price=price)


#: Models already warned about as unpriced, and the most this process warns about (the
#: names come from clients: a bounded set, not one line per request).
_UNPRICED: set[str] = set()
MAX_UNPRICED_WARNINGS = 100


def _warn_unpriced(deployment: Deployment, upstream: str) -> None:
    name = f"{deployment.provider}/{upstream}"
    if name in _UNPRICED or len(_UNPRICED) >= MAX_UNPRICED_WARNINGS:
        return
    _UNPRICED.add(name)
    logger.warning(
        "%s, served by the wildcard %r, has no price in the config or the packaged table: "
        "it is charged nothing; give the deployment input_cost_per_token and "
        "output_cost_per_token%s", name, deployment.group,
        "" if len(_UNPRICED) < MAX_UNPRICED_WARNINGS else " (no more such warnings)",
        extra={"model": name, "model_group": deployment.group})


def _read_table() -> dict[str, tuple[Decimal, Decimal]]:
    text = resources.files("triogate.routing").joinpath("prices.json").read_text()
    million = Decimal(1_000_000)
    return {
        name: (Decimal(str(inp)) / million, Decimal(str(out)) / million)
        for name, (inp, out) in json.loads(text)["usd_per_million_tokens"].items()
    }


#: The price table, read when this module is imported, not by the first request on the loop.
_TABLE = _read_table()


def _table() -> dict[str, tuple[Decimal, Decimal]]:
    return _TABLE


def table_price(model: str) -> Price:
    """The bundled list price of ``model`` (or of the name it is a dated snapshot of);
    zero when the table does not know it."""
    table = _table()
    name = priced_name(model, table)
    if name is None:
        return Price()
    inp, out = table[name]
    return Price(input_usd_per_token=inp, output_usd_per_token=out)


def table_models(providers: Iterable[str]) -> list[str]:
    """The price table's model names served by any of ``providers``, sorted."""
    wanted = set(providers)
    return sorted(n for n in _table() if provider_of(n).partition("/")[0] in wanted)
