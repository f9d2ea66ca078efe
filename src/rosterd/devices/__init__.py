"""A node's accelerator devices and its memory pools (layers 2-3).

- ``listing``: the pure parser of ``llama-server --list-devices``;
- ``breakdown``: the pure parser of llama-server's own memory breakdown;
- ``load_buffers``: the pure parser of what llama-server logs allocating per buffer as it
  loads, read into bytes per device at run time;
- ``nvml``: NVIDIA's management library, read through ``nvidia-ml-py`` where it loads;
- ``footprint``: a process's physical footprint on macOS (``proc_pid_rusage``), which
  counts the memory Metal wired for it;
- ``probe``: runs the listing on this machine;
- ``pools``: a node's pools from what it declares and what the probes found (pure).

A *pool* is one budget of memory on a node (DESIGN.md, Terms): host RAM, one device's
memory (``CUDA0``, ``ROCm0``, ``Vulkan0``, ...), or a Mac's GPU share of its unified
memory. A node with no devices declared or found has one pool, host RAM, as before.
"""

from rosterd.devices.listing import ListedDevice, parse_list_devices

__all__ = ["ListedDevice", "parse_list_devices"]
