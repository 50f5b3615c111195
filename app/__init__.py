"""The sd2 browser UI (Gradio). It reaches the backend only through the REST API (`app.client`)."""
