#compdef chatflow

_chatflow_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _CHATFLOW_COMPLETE=complete_zsh chatflow)
}

compdef _chatflow_completion chatflow
