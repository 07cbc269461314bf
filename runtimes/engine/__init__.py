"""The analysis engine: many variants of one calibrated IR, evaluated fast (see :mod:`.engine`).

- :mod:`.engine`: the :class:`Engine`, orchestrating the parts below (the overview);
- :mod:`.variants`: :class:`Variant` and the plain evaluation every result must equal;
- :mod:`.options`: valid options and the defaults derived from the model;
- :mod:`.plan`, :mod:`.cost`: steps, segments, cones and their FLOPs;
- :mod:`.runners`: steps and segments on numpy or onnxruntime sessions;
- :mod:`.cache`, :mod:`.reference`: the reference configuration's values of one sample;
- :mod:`.rows`: variants as rows of batched switch-part calls (onnxruntime);
- :mod:`.steps`: variants' cones re-executed step by step;
- :mod:`.whole`: variants run whole, at the integer level;
- :mod:`.results`: :class:`EngineResult` and the resumable results file;
- :mod:`.cluster`, :mod:`.executor`, :mod:`.shards`, :mod:`.distributed`: the variants in
  cost-balanced shards on a Ray cluster (:mod:`.ray_cluster`) or torchrun's ranks (:mod:`.torch_cluster`).
"""
from __future__ import annotations

from qir.runtimes.engine.engine import Engine
from qir.runtimes.engine.options import EngineOptions
from qir.runtimes.engine.results import RESULTS_FILE, EngineResult
from qir.runtimes.engine.variants import Variant, configured_clone, evaluate_plainly, load_variants, one_at_a_time

__all__ = ["Engine", "EngineOptions", "EngineResult", "Variant", "evaluate_plainly", "configured_clone", "one_at_a_time",
           "load_variants", "RESULTS_FILE"]
