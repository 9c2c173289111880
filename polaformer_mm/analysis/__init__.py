"""Analysis of models and measurements: the logic behind ``tools/analysis_tools/``.

The command line tools parse arguments and call these modules; tests and users can call
them directly. Importing this package imports none of its modules (they pull in
matplotlib, mmdet or a model registry as they need):

* :mod:`~polaformer_mm.analysis.attention_sites`: the attention modules of a backbone
  recorded in one forward pass (Pola linear attention, and the softmax attention of the PVT
  and Swin baselines), with the attention maps and row entropies of chosen queries.
* :mod:`~polaformer_mm.analysis.loading`: a config's model with its weights, and an image
  through the config's test pipeline.
* :mod:`~polaformer_mm.analysis.attention_maps` (and its figures,
  :mod:`~polaformer_mm.analysis.attention_figures`): maps, entropies and learned exponents
  of the Pola blocks of a config on an image
  (``tools/analysis_tools/visualize_attention.py``).
* :mod:`~polaformer_mm.analysis.benchmark`, :mod:`~polaformer_mm.analysis.memory` and
  :mod:`~polaformer_mm.analysis.benchmark_report`: time and peak memory of backbones side
  by side, each measurement optionally in a fresh process
  (``tools/analysis_tools/benchmark_backbone.py``).
* :mod:`~polaformer_mm.analysis.flops`: parameters and FLOPs of configs, the attention op
  counted (``tools/analysis_tools/get_flops.py``).
* :mod:`~polaformer_mm.analysis.gain_table`: each Pola run beside its softmax baseline, from
  the test metrics of work dirs (``tools/analysis_tools/gain_table.py``).
"""
