"""What connects rf-eval to lm-eval's harness: the startup hook that registers the models and tasks,
the task-index cache, lm-eval's RULER import, the run facts tasks read, and the chat-template rule."""
