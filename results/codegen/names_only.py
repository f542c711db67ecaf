"""One-off (issue 76): the code generated before the generated names stopped depending on
where a program sits (commit 5029737) against the code generated after (commit 5c6441a):
equal but for those names.

    python results/codegen/names_only.py BEFORE AFTER > results/codegen/names_only.txt

BEFORE and AFTER are folders of generated files, one subfolder per case (as ``convbench
codegen-hashes --dump`` writes them), both made with PYTHONHASHSEED=0.  A file passes
when it equals the other up to a consistent renaming of identifiers (one bijection per
case, across its files) in which every renamed pair is location-derived: the same name
but for the module prefix (``impls_<module>_`` before, ``cb_`` after) and the digits
(source line numbers).  DaCe 1.0.2 orders a nested function's arguments by name, so where
the renaming reorders them, a file passes when, with location-derived names made
location-free on both sides, each line holds the same tokens (the same permutation at the
definition and at the call).  The edits of text, the comments that no longer name Python
modules (the Winograd headers', a tensor-core helper's), are applied to BEFORE first.  Prints the renamed patterns,
the cases that needed the permutation, and every problem (none is the pass).
"""

import collections
import re
import sys
from pathlib import Path

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[fFlLuU]*|\s+|.", re.S)
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
#: The modules of impls/ before the move (the prefixes DaCe derived names from).
MODULES = sorted((
    "_backward _blocked _common _cp_async _direct _dpbf16 _fold _igemm _kernel _mma _mma_ptx "
    "_mma_wgrad _pipelined _pipelined_bwd _pipelined_tasklets _rules _tiling _transposed "
    "_winograd _winograd_adjoint _winograd_fields _winograd_filter _winograd_sdfg "
    "_winograd_tiled direct_conv_ncdhw direct_conv_ncdhw_bwd_data direct_conv_ncdhw_bwd_filter "
    "direct_conv_ncdhw_merged direct_conv_ncdhw_nobuffer direct_conv_ncdhw_tileic "
    "direct_conv_ndhwc_blocked direct_conv_ndhwc_blocked_bwd_data "
    "direct_conv_ndhwc_blocked_bwd_filter direct_conv_ndhwc_dot direct_conv_ndhwc_dot_bwd_data "
    "im2col_gemm implicit_gemm implicit_gemm_ncdhw_inplace").split(), key=len, reverse=True)
PREFIX = re.compile(r"\b(__dace_runkernel_)?impls_(?:" + "|".join(MODULES) + r")_")
#: The programs that were declared with @dace.program (the names after the new prefix).
PROGRAMS = r"(?:igemm|wgrad|bwd|implicit|direct|winograd|im2col)_"

#: The edits of text: the comments of the Winograd headers and of a tensor-core helper that
#: the generated code holds no longer name Python modules.
TEXT_EDITS = [
    ("""// The C++ every Winograd CPU kernel shares (impls/_winograd.py, _winograd_adjoint.py,
// _winograd_filter.py): the transform passes and the register-blocked GEMM step.
// Included by content in each kernel's generated code, after the definitions it needs:
// the vector types wg_v and wg_vu of VL floats and `static constexpr int VL`
// (impls/_winograd.py, vector_code).""",
     """// The C++ every Winograd CPU kernel shares (the forward, the data gradient as its
// adjoint, the filter gradient): the transform passes and the register-blocked GEMM step.
// Included by content in each kernel's generated code, after the definitions it needs:
// the vector types wg_v and wg_vu of VL floats and `static constexpr int VL` (written by
// the generator's vector_code)."""),
    ("""// The CPU kernel of 3D Winograd F(m^3, 3^3) on NDHWC (impls/_winograd.py: winogradF2 and,
// on the transposed layer with WG_FLIP, winogradF2BwdData).  Included by content after
// winograd_common.h and a prelude of compile-time constants that impls/_winograd.py
// writes for one layer and blocking (global_code):
//   the transforms WG_AT [m][n], WG_G [n][3], WG_BT [n][n], from convbench.winograd;""",
     """// The CPU kernel of 3D Winograd F(m^3, 3^3) on NDHWC (winogradF2 and, on the transposed
// layer with WG_FLIP, winogradF2BwdData).  Included by content after winograd_common.h
// and a prelude of compile-time constants that its generator writes for one layer and
// blocking (global_code):
//   the transforms WG_AT [m][n], WG_G [n][3], WG_BT [n][n], computed from their points;"""),
    ("//   the blocking (impls/_winograd.py, Blocking): WG_T", "//   the blocking (Blocking): WG_T"),
    ("// The byte of lane ln's value in a 128-byte block of a blocked tile (_mma.blocked): value",
     "// The byte of lane ln's value in a 128-byte block of a blocked tile: value"),
]


def location_free(text: str, after: bool) -> str:
    """Location-derived names without their location: module prefix and line numbers."""
    text = (re.sub(r"\b(__dace_runkernel_)?cb_(?=" + PROGRAMS + ")", r"\1", text) if after
            else PREFIX.sub(r"\1", text))
    text = re.sub(r"\b(__tmp|assign|augassign|s|call_[a-z_]+|for|if|while|postloop)_\d+",
                  r"\1_L", text)
    return re.sub(r"\b([a-z_]+)_\d+(_\d+_\d+_\d+)", r"\1_L\2", text)


def location_derived(old: str, new: str) -> bool:
    o, n = re.sub(r"\d+", "#", old), re.sub(r"\d+", "#", new)
    if o == n:
        return True  # only digits (line numbers) differ
    for pre in ("__dace_runkernel_", ""):
        if o.startswith(pre + "impls_") and n.startswith(pre + "cb_"):
            rest = n[len(pre) + 3:]
            return o.endswith(rest) and "_" + rest in o
    return False


def renaming(ta: str, tb: str, fwd: dict, back: dict, renames) -> str:
    """"" if ``tb`` is ``ta`` under a consistent, location-derived renaming (extending
    ``fwd``/``back``), else the problem."""
    xa, xb = TOKEN.findall(ta), TOKEN.findall(tb)
    if len(xa) != len(xb):
        return f"{len(xa)} vs {len(xb)} tokens"
    for s, t in zip(xa, xb):
        if s == t:
            if IDENT.match(s) and (fwd.setdefault(s, s) != s or back.setdefault(s, s) != s):
                return f"{s} kept here, renamed elsewhere"
            continue
        if not (IDENT.match(s) and IDENT.match(t)):
            return f"{s!r} -> {t!r} is not a renaming"
        if fwd.setdefault(s, t) != t or back.setdefault(t, s) != s:
            return f"{s} -> {t} inconsistent"
        if not location_derived(s, t):
            return f"{s} -> {t} not location-derived"
        renames[re.sub(r"\d+", "#", s) + "  ->  " + re.sub(r"\d+", "#", t)] += 1
    return ""


def permuted_only(ta: str, tb: str) -> bool:
    la, lb = location_free(ta, False).splitlines(), location_free(tb, True).splitlines()
    return len(la) == len(lb) and all(
        x == y or sorted(TOKEN.findall(x)) == sorted(TOKEN.findall(y)) for x, y in zip(la, lb))


def main(before: str, after: str) -> int:
    a, b = Path(before), Path(after)
    cases = sorted(p.name for p in a.iterdir())
    assert cases == sorted(p.name for p in b.iterdir()), "different cases"
    renames, problems, permuted, identical = collections.Counter(), [], [], 0
    kinds = collections.Counter()
    total = 0
    for case in cases:
        kind = "identical"
        files = sorted(str(p.relative_to(a / case)) for p in (a / case).rglob("*") if p.is_file())
        assert files == sorted(str(p.relative_to(b / case)) for p in (b / case).rglob("*")
                               if p.is_file()), case
        fwd, back = {}, {}
        for f in files:
            ta, tb = (a / case / f).read_text(), (b / case / f).read_text()
            for old, new in TEXT_EDITS:
                ta = ta.replace(old, new)
            total += 1
            if ta == tb:
                identical += 1
                continue
            problem = renaming(ta, tb, fwd, back, renames)
            if problem and permuted_only(ta, tb):
                permuted.append(f"{case}/{f}")
                kind = "permuted"
            elif problem:
                problems.append(f"{case}/{f}: {problem}")
                kind = "problem"
            elif kind == "identical":
                kind = "renamed"
        kinds[kind] += 1
    print(f"{len(cases)} cases: {kinds['identical']} identical, {kinds['renamed']} equal up to "
          f"the renaming, {kinds['permuted']} also with arguments permuted, "
          f"{kinds['problem']} with a problem")
    print(f"{total} files, {identical} identical after the edits of comments")
    print(f"renamed patterns (occurrences, before -> after, digits as #): {len(renames)}")
    for k, v in renames.most_common():
        print(f"  {v:6d}  {k}")
    print(f"files equal up to location-free names and a permutation within lines: {len(permuted)}")
    for name in permuted:
        print("  " + name)
    print(f"problems: {len(problems)}")
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
