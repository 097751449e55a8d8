"""OpenBLAS's kernels: importing fedfleet warns, naming the variable to set, exactly where
OpenBLAS took the CPU for one without AVX2 and OPENBLAS_CORETYPE is not set."""
import ast
import os
import subprocess
import sys

IMPORT = ("import warnings\n"
          "with warnings.catch_warnings(record=True) as caught:\n"
          "    warnings.simplefilter('always')\n"
          "    import fedfleet\n"
          "print(repr(fedfleet._core.blas_core_advice()))\n"
          "print('|'.join(str(w.message) for w in caught))\n")


def import_with(core):
    """(blas_core_advice(), the warnings' text) of a new Python importing fedfleet, with
    OPENBLAS_CORETYPE set to `core` (unset when None)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if core is not None:
        env["OPENBLAS_CORETYPE"] = core
    out = subprocess.run([sys.executable, "-c", IMPORT], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    return ast.literal_eval(out[0]), (out[1] if len(out) > 1 else "")


def test_import_warns_exactly_where_openblas_took_the_cpu_for_one_without_avx2():
    advice, warned = import_with(None)
    if advice is None:
        assert "OPENBLAS_CORETYPE" not in warned
    else:
        loaded, better = advice
        assert better in ("SkylakeX", "Haswell") and loaded != better
        assert f"runs its {loaded} kernels" in warned
        assert f"OPENBLAS_CORETYPE={better}" in warned


def test_a_core_named_in_the_environment_is_kept_without_a_warning():
    advice, warned = import_with("Prescott")
    assert advice is None
    assert "OPENBLAS_CORETYPE" not in warned
