"""Engine layer: one loader, several backends (TensorRT, torch, ONNX Runtime) behind one runner interface."""
