"""How often the CPU rules (impls/_rules.py) name the winners that `bench_cpu.py --store`
kept on the AVX-512 EPYC (family 26 model 2), the one tuned machine whose bench had the
Winograd kernels among its candidates: by kind (Winograd or direct) and by name.
python results/cpu/epyc_f25m17_avx512/unseen_machine/rules_vs_winners.py"""
import json
import re
from pathlib import Path

from convbench import registry
from convbench.layersets.layer import Layer
from convkernels.layouts import Pass

MACHINE = "AMD EPYC (family 26 model 2) | avx512f"
TUNING = Path(__file__).resolve().parents[4] / "tuning" / "cpu.json"
KEY = re.compile(r"b(\d+)_c(\d+)_k(\d+)_i(\d+)x(\d+)x(\d+)_f3x3x3_s1_p(\d+)$")

registry.load_implementations()
best = json.loads(TUNING.read_text())["machines"][MACHINE]["best"]
kind = name = total = 0
for pass_, winners in best.items():
    for key, winner in sorted(winners.items()):
        n, c, k, d, h, w, pad = map(int, KEY.match(key).groups())
        layer = Layer(key, n, c, k, d, h, w, 3, 3, 3, pad=pad)
        ruled = registry.by_rule(Pass(pass_), layer, "cpu",
                                 lambda i: not i.unsupported_reason(layer, i.resolve_params()))
        chosen = ruled[0].name if ruled else "-"
        total += 1
        kind += ("winograd" in chosen) == ("winograd" in winner)
        name += chosen == winner
        if chosen != winner:
            print(f"{pass_:10s} {key:40s} won: {winner:32s} rule: {chosen}")
print(f"the rules name the winner's kind on {kind} of {total}, the winner on {name}")
