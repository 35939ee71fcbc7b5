#!/usr/bin/env python3
"""Run a grcc-generated QT GUI flowgraph for a while and save a screenshot of its window.

    grcc -o /tmp/fg grc/loopback_qt.grc
    QT_QPA_PLATFORM=offscreen python scripts/grc_screenshot.py /tmp/fg/loopback_qt.py shot.png 10

Works without a display (Qt's offscreen platform). The flowgraph class is the file's stem (the
GRC id). Prints the link counters of ``rx_1``/``arq_0`` when the flowgraph has them.

The process leaves with ``os._exit`` once the flowgraph has stopped and the screenshot is saved:
the QT GUI sinks of GNU Radio before 3.10.10 (Debian 12 ships 3.10.5) dereference their widget in
their destructor after Qt may already have deleted it (gnuradio/gnuradio#7050, fixed by #7065), so
an ordinary interpreter exit segfaults now and then after all the work is done.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write(__doc__ or "")
        return 2
    path, out, secs = Path(argv[0]), argv[1], float(argv[2])
    from PyQt5 import Qt, QtCore

    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        sys.stderr.write(f"cannot load {path}\n")
        return 2
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = Qt.QApplication([])
    tb = getattr(module, path.stem)()
    tb.resize(1400, 1000)
    tb.start()
    tb.show()
    result: dict[str, int] = {}

    def grab() -> None:
        ok = tb.grab().save(out)
        result["saved"] = int(bool(ok))
        for name, fn in (("rx_1", "frames_ok"), ("rx_0", "frames_ok")):
            if hasattr(tb, name):
                print(f"{name}.{fn}() = {getattr(getattr(tb, name), fn)()}")
        if hasattr(tb, "arq_0"):
            arq = tb.arq_0.stats().get("arq", {})
            print("arq_0: " + ", ".join(f"{k} {v}" for k, v in arq.items()))
        tb.stop()
        tb.wait()
        print("flowgraph stopped")
        app.quit()

    QtCore.QTimer.singleShot(int(secs * 1000), grab)
    app.exec_()
    return 0 if result.get("saved") else 1


if __name__ == "__main__":
    faulthandler.enable()  # a crash inside Qt or a block prints where it happened
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the QT GUI sinks' destructors (see the docstring)
