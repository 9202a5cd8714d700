// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title A minimal ERC-20 token for paywatch's tests.
/// @notice Besides the standard calls it can misbehave on purpose:
/// fakeTransfer emits a Transfer event without moving any balance (the
/// "fake deposit" pattern), and transferThenRevert emits one and reverts.
contract Token {
    string public name;
    string public symbol;
    uint8 public immutable decimals;
    uint256 public totalSupply;
    address public immutable owner;

    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    constructor(string memory name_, string memory symbol_, uint8 decimals_) {
        name = name_;
        symbol = symbol_;
        decimals = decimals_;
        owner = msg.sender;
    }

    function mint(address to, uint256 value) external {
        require(msg.sender == owner, "only owner");
        totalSupply += value;
        balanceOf[to] += value;
        emit Transfer(address(0), to, value);
    }

    function transfer(address to, uint256 value) external returns (bool) {
        _move(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        require(allowed >= value, "allowance");
        if (allowed != type(uint256).max) {
            allowance[from][msg.sender] = allowed - value;
        }
        _move(from, to, value);
        return true;
    }

    /// @notice Several transfers in one transaction (several logs per tx).
    function batchTransfer(address[] calldata to, uint256[] calldata values) external {
        require(to.length == values.length, "length");
        for (uint256 i = 0; i < to.length; i++) {
            _move(msg.sender, to[i], values[i]);
        }
    }

    /// @notice Emits Transfer without moving value: a payment that is not one.
    function fakeTransfer(address to, uint256 value) external {
        emit Transfer(msg.sender, to, value);
    }

    /// @notice Moves value, emits Transfer, then reverts: nothing happened.
    function transferThenRevert(address to, uint256 value) external {
        _move(msg.sender, to, value);
        revert("reverted on purpose");
    }

    function _move(address from, address to, uint256 value) internal {
        require(balanceOf[from] >= value, "balance");
        balanceOf[from] -= value;
        balanceOf[to] += value;
        emit Transfer(from, to, value);
    }
}
