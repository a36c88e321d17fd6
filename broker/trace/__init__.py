"""Live traces of one client (`nautilus admin trace client`, VerneMQ's vmq_tracer): every
packet it sends and receives, every hook called for it, its session's events, on whichever
node of the cluster it is.

- trace.py: one trace: what it follows, its rate limit, where its lines go (no I/O);
- text.py: packets, hook calls and results as the lines show them;
- hooks.py: the hook chains that write the calls made for traced clients;
- tap.py: a traced connection: what it reads and writes, decoded;
- tracer.py: the node's traces, switched on only while there is one.

The cluster's part (starting traces on the other nodes, their lines coming back) is
broker/cluster/tracing.py; the admin API's stream broker/http/trace_stream.py.
"""
