"""Placement by cost: ``priority = "auto"``, ``hub.compile(mod, placement="auto")``.

With placement by priority, an operator goes to the first accelerator whose
patterns claim it. By cost, umahub considers for every group of operators each
accelerator whose patterns can take it, and the host, and chooses the
assignment with the lowest estimated end-to-end latency, copies included:

1. **candidates** (:mod:`umahub.auto.candidates`): each accelerator's matches
   on its own, as ``priority = [it]`` would make them; pins hold (a match
   holding an operator pinned elsewhere is no candidate; one holding an
   operator pinned to its accelerator is always taken);
2. **costs** (:mod:`umahub.auto.costs`): each group's seconds on its
   accelerator and on the host, from the plugin's ``umahub_cost``, the disk
   cache or a measurement; copies from the pools' ``bandwidth`` or timed;
3. **search** (:mod:`umahub.auto.search`): every claiming order, every
   accelerator alone and the host alone as starting points, then a local
   search; the lowest estimate wins;
4. the choice is carried out by partitioning with every accelerator's
   patterns, each match allowed only where the choice put its operators, and
   each a partition of its own, as it was timed (an accelerator that merges
   neighbouring matches lowers them as one kernel, whose cost the
   measurements of single matches do not tell); memory budgets are checked
   afterwards as always;
5. **finalists** (:mod:`umahub.auto.finalists`): the choice meets the
   contenders (the claiming orders, accelerators alone and the host alone
   that place differently, best estimated first, ``auto-finalists`` of them
   at most) one at a time: each is built and timed against the fastest so
   far, which stays or gives way; the verdict is cached (not when a plugin's
   ``umahub_cost`` gave costs, or with pins).

``report.auto`` keeps every group with its costs and why it went where it
went, the estimates of the starting points, and what changed against
``priority``; ``umahub explain --auto`` shows it without building the model.

The modules: :mod:`~umahub.auto.candidates`, :mod:`~umahub.auto.costs`,
:mod:`~umahub.auto.cache`, :mod:`~umahub.auto.search` (its starting points
named by :mod:`~umahub.auto.starts`), then
:mod:`~umahub.auto.choose` (the four put together, run by the pipeline),
:mod:`~umahub.auto.finalists` (the measured check) and
:mod:`~umahub.report.text` (the report's words for it).
"""
