"""Planning: every static choice a call makes (the Plan), from the shared
tables, the device's facts and the cost model; `Plan.explain()` says why."""
