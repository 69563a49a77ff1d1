"""One botocore loader per process, shared by every S3 client txsink creates."""

from __future__ import annotations

import threading
from typing import Any

_loader: Any = None
_loader_lock = threading.Lock()


def shared_botocore_session() -> Any:
    """A new botocore session whose service models come from one loader per process.

    botocore caches the parsed S3 model and endpoint rules per loader, and every boto3
    session has its own: creating a client cost about 0.1 s of CPU (0.6 s on two busy
    cores), and txsink creates several per epoch (each backend instance of a group has
    its own client). Sessions stay separate, so credentials never mix.
    """
    import botocore.loaders  # type: ignore[import-untyped,unused-ignore]
    import botocore.session  # type: ignore[import-untyped,unused-ignore]

    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        loader = _loader
    session = botocore.session.get_session()
    session.register_component("data_loader", loader)
    return session
