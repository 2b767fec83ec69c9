"""The MiniCPM4-style decoder (architecture only; TP shards via ParallelState, math via OpSet)."""

from engine.model.documents import DocumentLayout, batch_documents, document_layout
from engine.model.init import Initializer
from engine.model.transformer import IGNORE_INDEX, Transformer, build_model

__all__ = ["Transformer", "build_model", "Initializer", "IGNORE_INDEX", "DocumentLayout", "batch_documents",
           "document_layout"]
