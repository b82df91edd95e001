"""`swift app` (a chat page) and `swift web-ui` (the training console), built with gradio."""
