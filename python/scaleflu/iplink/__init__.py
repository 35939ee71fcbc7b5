"""IP over the link: a TUN interface per node whose packets ride the link's authenticated frames.

Any IP application (a Flower SuperLink and its SuperNodes, ROS 2, ssh, a log upload) runs over
the radio unchanged: each node has a TUN interface (``sfl<n>``, address ``10.77.0.<n+1>/24`` by
default) and an :class:`~scaleflu.iplink.bridge.IpBridge` that carries each IP packet as one
message of the node's :class:`~scaleflu.link.Link` (the ARQ, the shared medium's MAC, the
server's scheduling) to the node the destination address names, and writes what the link
delivers to the interface. The link's own keys authenticate every frame
(:func:`~scaleflu.iplink.bridge.open_tunnel_link`: ``require_auth``, and link-level broadcast
refused): a node without a key cannot put a packet into another node's tunnel.

* :mod:`scaleflu.iplink.tun`: the TUN device (Linux, ``/dev/net/tun``);
* :mod:`scaleflu.iplink.netns`: network namespaces and interface set-up (``ip``);
* :mod:`scaleflu.iplink.bridge`: the address plan, the bridge, the tunnel's link;
* :mod:`scaleflu.iplink.node`: one node's process (``scaleflu iplink node``);
* :mod:`scaleflu.iplink.testbed`: the local testbed, each node in its own namespace.

Creating interfaces and namespaces needs root (CAP_NET_ADMIN); without it every entry point
says so in one line (:class:`~scaleflu.iplink.netns.IpLinkPermissionError`). Guide:
docs/ip-over-radio.md.
"""

from scaleflu.iplink.netns import IpLinkError, IpLinkPermissionError, check_root

__all__ = ["IpLinkError", "IpLinkPermissionError", "check_root"]
