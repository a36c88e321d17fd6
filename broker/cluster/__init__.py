"""This node among others: the Cluster that makes and joins the parts (node.py; its
module docstring lists them, one job each), the metadata interface (metadata.py) and
following it (sync.py), the cluster channel's frames and links (frames.py, link.py), the
routing view of other nodes (remote.py, view.py), and sessions moving between nodes
(handover.py). Imported only when `[cluster]` is enabled."""
