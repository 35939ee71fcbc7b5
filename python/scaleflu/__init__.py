"""gr-scaleflu: SCALE federated unlearning over GNU Radio OFDM links.

Sub-packages:
  link        wire format, fragmentation, ARQ (pure Python, no GNU Radio)
  radio       GNU Radio blocks, OFDM hier blocks, flowgraphs, UHD (the only part importing gnuradio)
  fl          FedAvg runtime, models, data sets, history store
  unlearn     SCALE, baselines, metrics and audits
  experiments configs and runners for the paper's tables and figures
"""

__version__ = "0.1.0"
