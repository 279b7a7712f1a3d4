"""Where to look on Google Cloud for a run with no local state, or for a place to check: the options `dsctl down`,
`dsctl logs`, `dsctl runs show` and `dsctl check` offer for it (specs/places.py points at them, so the commands read
them without importing the rest of this provider). bylabel.py and preflight.py read their values (a Where).
"""

from __future__ import annotations

from ..contract import LocateOption

OPTIONS = (
    LocateOption("project", "Google Cloud project to search when RUN has no local state, or to check (default: "
                            "GOOGLE_CLOUD_PROJECT, or gcloud's)"),
    LocateOption("zone", "Google Cloud zone to search when RUN has no local state, or to check (default: "
                         "CLOUDSDK_COMPUTE_ZONE)", frozenset({"down", "check"})),
    LocateOption("bucket", "its staging bucket, if not <project>-dsctl (no local state)", frozenset({"down", "record"}),
                 hint=False),
)
