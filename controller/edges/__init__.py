"""The controller's edges: who may call (auth, audit); the servicers move here in the redesign."""
