"""convbench: a workbench for 3D-convolution compiler experiments with DaCe.

The package is the harness every tool of the project runs on, in packages by role (their
layering is docs/architecture.md's, enforced by ``setup.cfg``'s contracts): layer sets
(:mod:`convbench.layersets`), the implementation registry (:mod:`convbench.registry`),
builds (:mod:`convbench.build`), checks (:mod:`convbench.check`), timing
(:mod:`convbench.timing`), result files and plots (:mod:`convbench.results`,
:mod:`convbench.plots`), the pipeline (:mod:`convbench.experiment`), parameter search
(:mod:`convbench.tuning`), the commands (:mod:`convbench.commands`), sweeps
(:mod:`convbench.sweep`), the networks (:mod:`convbench.network`) and the GPU campaign
(:mod:`convbench.campaign`).  Implementations are registered by the top-level ``impls``
package, one module each, from the kernel library ``convkernels``.
"""

__version__ = "0.1.0"
