"""scaleflu.testbed: edge server and robot apps over the link API, and the local testbed.

``protocol`` (authenticated, replay-protected envelopes), ``server`` (:class:`EdgeServer`,
composed of ``sessions``, ``rounds``, ``downlink``, ``unlearn_service`` and ``records``),
``robot`` (:class:`RobotClient`), ``transport`` (link back-ends for the apps), ``launcher``
(the one-command local testbed), ``report`` (JSON + plots). GNU Radio is imported only when a
radio link is chosen, through ``scaleflu.radio``.
"""
