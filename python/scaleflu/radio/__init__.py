"""scaleflu.radio: the GNU Radio side of the link (the only part of scaleflu importing gnuradio).

Modules:
  ofdm      OFDM link hier blocks ofdm_link_tx / ofdm_link_rx (stock gr-digital OFDM, padding,
            header guard, sized buffers)
  blocks    message blocks link_arq (ARQ endpoint) and frame_drop (tests); star-imported by
            ``gnuradio.scaleflu``
  links     Link back-ends: OfdmLoopbackLink, ZmqOfdmLink, UhdLink and make_link(kind, node_id)
  uhd       usrp_tx / usrp_rx with a one-line RadioNotFound error when no device answers
  linktest  ``python -m scaleflu.radio.linktest``: send/receive one test message over any link

See docs/link.md sections 8 and 9.
"""
