"""treerank.readers: datasets on disk -> `RetrievalSplit` (texts + candidate lists + labels)."""

from treerank.readers.detect import FORMATS, detect_format, read_split
from treerank.readers.errors import DataFormatError
from treerank.readers.split import RetrievalSplit

__all__ = ["FORMATS", "DataFormatError", "RetrievalSplit", "detect_format", "read_split"]
