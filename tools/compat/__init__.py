"""The vendor-compatible surfaces: hmct-debugger's function names and flags (:mod:`.hmct`) and the
QuantAnalysis class (:mod:`.quant_analysis`), each a translation onto qir's own passes and reports."""
