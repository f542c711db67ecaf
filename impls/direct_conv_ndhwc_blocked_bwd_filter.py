"""``directConvNDHWCblockedBwdFilter``: dL/dw on NDHWC, register-blocked, for the CPU.

The kernel: :mod:`convkernels.cpu.direct.filter_gradient`.
"""

from convbench.registry import ALL_PRECISIONS, Implementation, Layout, Param, Pass, register
from convkernels.cpu.direct import filter_gradient
from convkernels.cpu.direct.blocking import cpu_schedule, lanes_param, nv_param, switch
from convkernels.cpu.rules import DIRECT

register(Implementation(
    name="directConvNDHWCblockedBwdFilter",
    search_space="SLICES=0,8;CB=2,8;NV=1,2;ROWS=0,4,8;SPLIT=0,1",
    default_for=("network-cpu",),
    summary="backward filter on NDHWC for the CPU: the pixel reduction split into "
            "(batch x depth-chunk) slices with private partial gradients, then summed; "
            "register-blocked micro-tiles of (width taps x CB input channels) x NB output "
            "channels (vectors over dy), OpenMP over slices and tiles",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=filter_gradient.algorithm,
    schedules={"cpu": cpu_schedule},
    params=(Param("SLICES", 8, "chunks of output depth planes per batch element, each "
                               "with its own partial gradient (the largest divisor of the "
                               "depth up to SLICES, fewer where the partials would pass "
                               "half of the last-level cache); 0: no slices, each tile "
                               "reduces over all pixels and writes dL/dw itself (ROWS unused)",
                  minimum=0),
            # CB 2 x NV 2 (x 3 width taps: 12 accumulators, AVX2's whole budget): of the 51
            # entries tuned on three machines, AVX2 and AVX-512 (tuning/cpu.json), 44 chose
            # NV 2 and 30 both; conv1 of MLPerf 64^3 b2: 16.9 ms against 25.2 with NV 1
            # (AMD EPYC f25m17, results/cpu/epyc_f25m17_avx512/unseen_machine/conv1/).
            Param("CB", 2, "broadcast channels per micro-tile: input channels (FORM 0, a "
                           "divisor of C) or output channels (FORM 1, of K)"),
            lanes_param("NB", "vector lanes: output channels (FORM 0, a divisor of K) or "
                              "input channels (FORM 1, of C)"),
            nv_param(2),
            Param("TAPW", 1, "1: the kernel's width taps share each dy load in one tile",
                  minimum=0, check=switch),
            Param("TAPS", 0, "1: the depth and height taps loop inside each output row "
                             "(its dy and x rows stay in cache), 0: they are map dimensions",
                  minimum=0, check=switch),
            Param("ROWS", 0, "0: each tile sweeps its slice whole; else blocks of ROWS "
                             "output rows (a divisor of the height), each swept by all "
                             "tiles in turn, the slice's partial kept in cache (TAPS unused)",
                  minimum=0),
            Param("PLANES", 1, "(with ROWS) depth planes per row block: each tile's "
                               "accumulators are loaded from and stored to the partial once "
                               "per ROWS rows of PLANES planes (a divisor of the slice's "
                               "planes)"),
            Param("KFIRST", 0, "1 (with ROWS): the vector-channel blocks loop outside the "
                               "row blocks, so that a large partial is swept in shares",
                  minimum=0, check=switch),
            Param("SPLIT", 1, "1: one vector loop per width tap in each output pixel, "
                              "so that only that tap's broadcasts are live at a time; 0: one "
                              "loop for the whole micro-tile",
                  minimum=0, check=switch),
            Param("FORM", 0, "0: vectors over the output channels (dL/dy), broadcasts of "
                             "x; 1: vectors over the input channels (x), broadcasts of "
                             "dL/dy, so that both operands' cache lines are used whole",
                  minimum=0, check=switch)),
    anisotropic_pad=True,
    registers=filter_gradient.registers,
    precisions=ALL_PRECISIONS,
    wins=(DIRECT,),
))
