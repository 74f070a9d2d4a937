"""Weight swaps, applied by the engine alone: `weights/` loads and checks a new target or drafter in the caller's thread
(the old one decodes on); the swapper wraps it in a record (`state.TargetSwap` / `DraftSwap`) and hands it over in
`state.swap`; the decode thread applies it between two iterations (`apply`, under the lock) and sets `done`. Unless
generation is paused, a target swap drains first (SGLang's update lock): the admitted requests finish, later ones are
held, so no response mixes versions. Under a pause (SGLang applies at once) it lands under the paused requests: with
`flush_cache` their KV is rebuilt from their prefixes by the new weights, and each records where its version changed
(`Sequence.version_events` -> `weight_versions`). A drafter swap never waits (SD is lossless: it changes speed only).

A swap that fails while applied (e.g. the cache rebuild runs out of memory) is undone: the old weights keep serving, the
decode thread lives on, and the caller gets the error. A drain waits at most `cfg.swap_timeout_s`; then the swap is
withdrawn and refused, and the held requests run."""

from __future__ import annotations

from gleanrl.server.config import EngineConfig
from gleanrl.server.decode.sd_decoder import SDDecoder
from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import DraftSwap, EngineState, TargetSwap
from gleanrl.server.protocol import CheckpointError
from gleanrl.server.sampling.sequence import SequenceStatus
from gleanrl.server.weights import checkpoint


class WeightSwapper:
    """Owns the serving target checkpoint's identity (path, config, tensor signature)."""

    def __init__(self, cfg: EngineConfig, config: dict, state: EngineState, scheduler: Scheduler, decoder: SDDecoder):
        self.cfg, self.state, self.scheduler, self.decoder = cfg, state, scheduler, decoder
        self.model_path, self.config = cfg.model_path, config
        self.signature = checkpoint.checkpoint_signature(cfg.model_path)

    def load_target(self, path: str, version: str | None, flush_cache: bool) -> TargetSwap:
        runner, config, sig = checkpoint.load_checked(
            path, self.config, self.signature, self.cfg.device, self.cfg.dtype
        )
        return TargetSwap(runner, config, sig, path, version, flush_cache)

    def load_draft(self, path: str, version: str | None) -> DraftSwap:
        if self.cfg.sd == "off":
            raise CheckpointError(
                "this server runs with speculative decoding off (sd 'off'), "
                "so it serves no drafter; start it with --sd on or --sd adaptive"
            )
        return DraftSwap(checkpoint.load_for_target(path, self.scheduler.runner, self.config), path, version)

    def expected(self, selector: str) -> checkpoint.Signature:
        """The tensors an update of `selector` may carry (read from the headers, not loaded)."""
        if selector == "target":
            return self.signature
        if not self.decoder.draft_path:
            raise CheckpointError(
                "selector=draft: no drafter is served, so there is no drafter config to update; "
                "load one with /update_weights_from_disk selector=draft first"
            )
        return checkpoint.checkpoint_signature(self.decoder.draft_path)

    def load_tensors(
        self, selector: str, named: checkpoint.NamedTensors, version: str | None, flush_cache: bool
    ) -> TargetSwap | DraftSwap:
        """Named tensors as a swap of `selector` (`weights/checkpoint.py`): names, shapes and dtypes first, before
        anything reads the data or copies a model."""
        checkpoint.check_named(self.expected(selector), selector, named)
        runner = self.scheduler.runner
        if selector == "draft":
            path = self.decoder.draft_path
            return DraftSwap(checkpoint.overlay_drafter(path, named, runner, self.config), path, version)
        new_runner = checkpoint.target_runner(runner, checkpoint.check_target(named, runner.dtype))
        return TargetSwap(new_runner, self.config, self.signature, self.model_path, version, flush_cache)

    def submit(self, swap: TargetSwap | DraftSwap, apply_now: bool) -> None:
        """Hand `swap` to the decode thread (or apply it here when there is none) and wait until applied;
        CheckpointError when it failed or its drain timed out (the old weights keep serving either way)."""
        st = self.state
        with st.cv:
            if st.swap is not None:
                raise CheckpointError("another weight update is in progress")
            if isinstance(swap, TargetSwap):
                swap.drain = st.paused is None
            st.swap = swap
            if apply_now:
                self.apply()
            st.cv.notify_all()
        if not swap.done.wait(self.cfg.swap_timeout_s):
            with st.cv:
                if st.swap is swap:
                    st.swap = None
                    self._release_held()
                    st.cv.notify_all()
                    raise CheckpointError(
                        f"the weight update waited {self.cfg.swap_timeout_s:g} s for running requests to finish and "
                        "was withdrawn; pause generation or pass abort_all_requests"
                    )
            swap.done.wait()
        if swap.error is not None:
            raise CheckpointError(
                "the weight update failed while being applied and was undone (the old weights keep serving): "
                f"{type(swap.error).__name__}: {swap.error}"
            )

    def draining(self) -> bool:
        """Under the lock: a target swap waits for the admitted requests (new ones are held meanwhile)."""
        return isinstance(self.state.swap, TargetSwap) and self.state.swap.drain

    def ready(self) -> bool:
        """Under the lock: the pending swap may be applied now. A draining one once nothing admitted is left, or once
        generation was paused after all (it then lands under the paused requests)."""
        st = self.state
        return st.swap is not None and (not self.draining() or st.paused is not None or not (st.running or st.waiting))

    def apply(self) -> None:
        """Under the lock, between iterations. Never raises: a failure is undone and left in `swap.error`."""
        st = self.state
        swap, st.swap = st.swap, None
        try:
            if isinstance(swap, DraftSwap):
                self._apply_draft(swap)
            else:
                self._apply_target(swap)
        except Exception as exc:
            swap.error = exc
        self._release_held()
        swap.done.set()

    def _release_held(self) -> None:
        for seq in self.state.held:
            seq.status = SequenceStatus.WAITING
        self.state.waiting.extend(self.state.held)
        self.state.held.clear()

    def _apply_draft(self, swap: DraftSwap) -> None:
        st = self.state
        self.decoder.set_drafter(swap.drafter, swap.path)
        st.draft_weight_version = swap.version if swap.version is not None else st.draft_weight_version or "default"

    def _apply_target(self, swap: TargetSwap) -> None:
        st, old_runner = self.state, self.scheduler.runner
        self.scheduler.runner = swap.runner
        if swap.flush_cache:
            try:
                self.scheduler.rebuild_caches()
            except Exception:
                self.scheduler.runner = old_runner
                self._rebuild_or_abort()
                raise
        if swap.version is not None and swap.version != st.weight_version:
            for s in [*st.running, *st.waiting]:
                if s.output_ids:
                    s.version_events.append((st.weight_version, len(s.output_ids)))
            st.weight_version = swap.version
        self.model_path, self.config, self.signature = swap.path, swap.config, swap.signature

    def _rebuild_or_abort(self) -> None:
        """After a failed rebuild: give the running requests fresh caches, or abort them if even that fails."""
        try:
            self.scheduler.rebuild_caches()
        except Exception as exc:
            for s in self.state.running:
                s.abort_message = s.abort_message or f"engine error during a weight update: {exc}"
