"""The model: a folder's own settings read without torch, the encoder and its poolings (PromptBERT's included),
fast encoding (ONNX Runtime), embedding files, the teacher's folder and stored vectors.

Imports ``sentcl.data`` at most; nothing of training or evaluation.
"""
