"""The benchmarks' concurrency-keyed task, in an app of its own: a supervisor that knows a
task with ``concurrency_limit`` claims every task the keyed way (one more statement per
claim round), so only the runs that measure keyed tasks install this app (BENCH_KEYED=1,
``bench_settings``): plain tasks are measured as a project without keyed tasks runs them."""
