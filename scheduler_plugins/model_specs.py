"""The model specs a process knows, by name: each validated once, where it enters.

The scheduler's table fills from the catalog (the plugin's construction),
jobs (``shoal_submit``) and gateways (their catalogs); a worker's and a
gateway process's fill from the scheduler's replies. A spec travels as plain
fields (`protocol.SpecFields`, ``ModelSpec.model_dump()``), so each table
keeps the fields it sends beside the spec: no pull dumps a spec again, and
fields equal to those kept are not validated again.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from ..configs import ConfigError, ModelSpec
from .protocol import SpecFields


class ModelSpecs(dict[str, ModelSpec]):
    """Specs by name, changed only through `add`; `fields`: each as it travels, `version`: counts changes."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, SpecFields] = {}
        self.version = 0

    def add(self, incoming: Mapping[str, ModelSpec | SpecFields], source: str) -> bool:
        """Keep `incoming`, all or none: a bad spec is a ConfigError naming `source`, the model and its fields.

        True when a spec is new or changed.
        """
        changed: dict[str, ModelSpec] = {}
        for name, spec in incoming.items():
            if not isinstance(spec, ModelSpec):
                if self.fields.get(name) == spec:
                    continue
                spec = _validated(name, spec, source)
            if self.get(name) != spec:
                changed[name] = spec
        for name, spec in changed.items():
            self[name] = spec
            self.fields[name] = spec.model_dump()
        self.version += bool(changed)
        return bool(changed)


def _validated(name: str, fields: SpecFields, source: str) -> ModelSpec:
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"{source}: model {name!r} has no valid spec: {problems}") from None
