"""Every file an analysis leaves behind: one writer module per report (txt / csv / json / png),
the aligned text tables (:mod:`.tables`) and the one matplotlib setup (:mod:`.plots`). Passes
return reports; only these modules write them, every file through :class:`.output.Outputs` (the
one rule: checked before the work, never replaced without ``--force``, written atomically)."""
