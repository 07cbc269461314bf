"""The ``nash-m`` march (J6M, S100P): ``nash-e`` plus its documented differences."""
from __future__ import annotations

from qir.runtimes.march.nash_e import DOC_SUMMARY, NASH_E, nash_rates
from qir.runtimes.march.profile import A, D, S, derive_profile

__all__ = ["NASH_M"]

_M_RATES = nash_rates(128, "J6M")

NASH_M = derive_profile(
    NASH_E,
    name=S("nash-m", D, "hmct / horizon_plugin_pytorch march name (J6M)"),
    aliases=S(("J6M", "S100P"), D, "S100 OE terminology: J6M = nash-m",
              items={"S100P": (A, "S100P = nash-m is our inference from page titles listing "
                                  "'S100/S100P' for J6E/M")}),
    gemm_dtype_pairs=S((("int8", "int8"), ("int16", "int8"), ("int16", "int16")), D,
                       "input x weight; (int8, int16) is not documented (disallowed)",
                       items={("int16", "int16"): (D, "dual-int16 example on J6M: " + DOC_SUMMARY)}),
    tune_ladder=S(NASH_E.tune_ladder, D, NASH_E.provenance["tune_ladder"].note
                  + "; int16+w16: dual int16 is documented on J6M"),
    peak_tops=S(_M_RATES[0], A, NASH_E.provenance["peak_tops"].note, items=_M_RATES[1]),
)
