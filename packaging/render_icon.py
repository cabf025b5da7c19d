"""Render the app icon (app/resources/specula.svg) to a PNG with Qt: `python packaging/render_icon.py`
writes resources/specula.png (256x256), the icon the desktop file, the PyInstaller bundle and Linux
icon themes use where an SVG will not do."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "app" / "resources" / "specula.svg"
PNG = ROOT / "resources" / "specula.png"


def render(svg: Path = SVG, png: Path = PNG, size: int = 256) -> Path:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (fonts and painting need it)
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    png.parent.mkdir(parents=True, exist_ok=True)
    if not image.save(str(png), "PNG"):
        raise OSError(f"could not write {png}")
    return png


if __name__ == "__main__":
    print(render())
