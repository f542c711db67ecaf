"""One implementation on one layer of a named set: the case the GPU campaign plans and
the test suite parametrises (``tests/cases.py``), each with its own ``id``."""

from __future__ import annotations

import dataclasses
from typing import Dict

from convbench.layersets.layer import Layer


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """One implementation on one layer of a named set: the base of the campaign's cases
    and of the tests' (``tests/cases.py``), each with its own ``id`` and
    ``resolved_params()``."""

    impl: str
    layer: Layer
    layer_set: str
    target: str = "gpu"
    #: The storage precision (:mod:`convbench.build.precision`); empty: the implementation's
    #: first (float32 where it has it).
    dtype: str = ""

    @property
    def implementation(self):
        from convbench import registry
        return registry.get(self.impl)

    @property
    def pass_(self):
        return self.implementation.pass_

    @property
    def precision(self) -> str:
        return self.dtype or self.implementation.precisions[0]

    def resolved_params(self) -> Dict[str, int]:
        """The parameters a build of this case uses: the tuned entry of this machine for
        the layer, else the implementation's defaults."""
        from convbench.build import tuned
        return tuned.tuned_params(self.implementation, self.layer, self.target, {})

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict):
        """The case of :meth:`to_json` (of this class or a subclass: keys that this class
        does not have are dropped)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and k != "layer"},
                   layer=Layer(**data["layer"]))

    def job(self):
        from convbench.build.cache import Job
        return Job(self.impl, self.layer, self.target, self.resolved_params(),
                   dtype=self.precision, label=self.id)
