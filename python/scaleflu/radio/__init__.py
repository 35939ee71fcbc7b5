"""scaleflu.radio: the GNU Radio side of the link (the only part of scaleflu importing gnuradio).

Modules:
  ofdm            OFDM link hier blocks ofdm_link_tx / ofdm_link_rx (stock gr-digital OFDM,
                  padding, header guard, sized buffers)
  phy             PhyConfig (which transmitter and receiver, their parameters), ChannelConfig
                  (simulated channel of a pair), burst_power, phy_rate_bytes_per_s
  message_blocks  message blocks link_arq (ARQ endpoint) and frame_drop (tests)
  uhd             usrp_tx / usrp_rx with a one-line RadioNotFound error when no device answers
  medium          the sample-level shared medium: config, model, broker, GNU Radio port
  links           the Link back-ends: loopback, pairs (ZeroMQ), shared (medium), usrp (radio)
  blocks          the export face of ``gnuradio.scaleflu`` (GRC): nothing here imports it

A further PHY (a coded OFDM transmitter and receiver, say) is a module beside ``ofdm`` that
``phy.PhyConfig`` can build; a further back-end is a module in ``links``. Link kinds (names,
defaults, which back-end) are not chosen here but in :mod:`scaleflu.linkkinds`. See
docs/link.md sections 8 to 10.
"""
