"""`dsctl profile`: where a pipeline's CPU goes, how many workers it needs, and what would make it cheaper.

    session.py   profile_job(): the order of the measurements, the recorded run
    process.py   the profiling process (runtime/profiling/child.py), contained, asked, ended
    analysis.py  the table, what bounds throughput, the worker formula (pure)
    advice.py    candidate changes and the variants that measure them (pure)
    record.py    the profile as dsctl keeps it (typed)
    chart.py     one bar per transformation
    uses.py      profiles read back: sweep --profile, autoscale.start: profile
"""
