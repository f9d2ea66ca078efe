"""When a role's KV cache is saved while it is idle (DESIGN.md layer 6, pure): the node
machine's idle-save rule.

A role whose backend keeps its KV cache (``keep_kv``) used to save it only inside its
stop, so the request that evicted it waited for the save and its fsync (issue 31:
gemma-3 270M holding a 3,700-token conversation, 348-749 ms for that request against
195-211 ms without keeping). :class:`KvSaveRules` moves the save to where nobody waits:
once a role has served a request and then stayed idle ``kv_idle_save_s`` (nothing
running, nobody queued, no probe, no transition), it emits ``SaveKv``; until its
``KvSaveDone`` no lease of the role is granted, so the save never runs beside a
request on the role's slots and never races a new grant (the grants are this machine's
alone). A later stop finds the slots saved and only stops the process; a role that
served a request after its last save is saved in its stop, as before.

No clock, no I/O, no logging: every call carries ``now`` and the rule appends effects to
the shared :class:`~rosterd.scheduler.state.MachineState`.
"""

from __future__ import annotations

from rosterd.scheduler.events import KvSaveDone, SaveKv
from rosterd.scheduler.state import MachineState
from rosterd.scheduler.values import Phase


class KvSaveRules:
    """The idle save of the roles' KV caches (see the module); ``state``: the node's
    shared state."""

    def __init__(self, state: MachineState) -> None:
        self.state = state

    def schedule(self, now: float) -> None:
        """Emit ``SaveKv`` for every ready role that served a request since its last save
        (or its load) and has been idle ``kv_idle_save_s`` seconds since."""
        quiet_s = self.state.limits.kv_idle_save_s
        for role, st in self.state.roles.items():
            if (
                st.kv_changed
                and not st.kv_saving
                and st.phase is Phase.READY
                and st.endpoint is not None
                and st.running == 0
                and not st.waiters
                and not st.probing
                and not st.suspected
                and not st.unload_tickets
                and st.next_spec is None
                and now - st.last_used >= quiet_s
            ):
                st.kv_saving = True
                st.kv_changed = False
                self.state.out.append(SaveKv(role, st.generation))

    def on_saved(self, ev: KvSaveDone) -> None:
        """The save returned: the role's leases may be granted again (the step grants)."""
        st = self.state.roles.get(ev.role)
        if st is not None and ev.generation == st.generation:
            st.kv_saving = False
